"""Real gRPC for proxyless tests: servers that answer their name, a bootstrap, an xDS client process.

The client runs in its own process because gRPC reads its xDS bootstrap
(``GRPC_XDS_BOOTSTRAP``) once per process; run as a script, this file is
that client (or, with ``--serve NAME HOST PORT``, an xDS-enabled server that
takes its listener from meshpilot before it serves). The client keeps one
channel per target for its whole life, so a test can change config while it
runs, and takes orders as JSON lines on stdin:
``{"target": ..., "calls": N, "metadata": [[key, value], ...]}``. For each
it answers one line, ``{"names": {server name: count}, "errors": {code: count}}``.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc

SERVICE = "meshpilot.test.Echo"
METHOD = "Name"
#: The full method path the client calls (no proto: bytes in, bytes out).
METHOD_PATH = f"/{SERVICE}/{METHOD}"
INBOUND_TEMPLATE = "xds.istio.io/grpc/lds/inbound/%s"
#: Seconds one call may take, waiting for xDS included.
CALL_TIMEOUT = 3


class NameServer:
    """A real gRPC server on host:port whose one method answers the server's name."""

    def __init__(self, name: str, host: str, port: int, *, xds: bool = False) -> None:
        self.name = name
        self.address = f"{host}:{port}"
        self.calls = 0
        #: An xDS server asks for ``xds.istio.io/grpc/lds/inbound/HOST:PORT`` and serves only once it has it.
        self.xds = xds
        self._server: grpc.Server | None = None

    def _answer(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        self.calls += 1
        return self.name.encode()

    def start(self) -> NameServer:
        # No SO_REUSEPORT (gRPC's default): a port taken by anyone else must fail the bind, not share.
        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=2), options=[("grpc.so_reuseport", 0)], xds=self.xds
        )
        handler = grpc.method_handlers_generic_handler(
            SERVICE, {METHOD: grpc.unary_unary_rpc_method_handler(self._answer)}
        )
        server.add_generic_rpc_handlers((handler,))
        if server.add_insecure_port(self.address) == 0:
            raise RuntimeError(f"cannot bind {self.address}")
        server.start()
        self._server = server
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(grace=None).wait(5)
            self._server = None


def bootstrap(
    *, xds_port: int, node_id: str, metadata: Mapping[str, Any], locality: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """A gRPC xDS bootstrap pointed at meshpilot's plaintext port, as istio-agent writes one."""
    return {
        "xds_servers": [
            {
                "server_uri": f"127.0.0.1:{xds_port}",
                "channel_creds": [{"type": "insecure"}],
                "server_features": ["xds_v3"],
            }
        ],
        "node": {"id": node_id, "metadata": dict(metadata), "locality": dict(locality or {})},
        "server_listener_resource_name_template": INBOUND_TEMPLATE,
    }


def write_bootstrap(path: Path, **kwargs: Any) -> Path:
    path.write_text(json.dumps(bootstrap(**kwargs), indent=2))
    return path


class GrpcClient:
    """The xDS client process, driven line by line; its log holds gRPC's own messages."""

    def __init__(
        self, workdir: Path, name: str, bootstrap_path: Path, trace: str = "", args: Sequence[str] = ()
    ) -> None:
        self.name = name
        self.log_path = workdir / f"grpc-{name}.log"
        env = {**os.environ, "GRPC_XDS_BOOTSTRAP": str(bootstrap_path), "GRPC_VERBOSITY": "ERROR"}
        if trace:
            env.update(GRPC_TRACE=trace, GRPC_VERBOSITY="DEBUG")
        self._log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            env=env,
            start_new_session=True,
        )

    def calls(
        self,
        target: str,
        n: int,
        metadata: Sequence[tuple[str, str]] = (),
        *,
        timeout: float | None = None,
    ) -> tuple[Counter[str], Counter[str]]:
        """Make ``n`` unary calls to ``target``: (answers by server name, errors by status code)."""
        if timeout is None:
            timeout = CALL_TIMEOUT * n + 10  # every call may time out, and each is counted
        assert self.proc.stdin is not None and self.proc.stdout is not None
        order = {"target": target, "calls": n, "metadata": [list(m) for m in metadata]}
        self.proc.stdin.write((json.dumps(order) + "\n").encode())
        self.proc.stdin.flush()
        deadline = time.monotonic() + timeout
        line = b""
        while not line.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0 or self.proc.poll() is not None:
                raise AssertionError(f"gRPC client gave no answer for {order}:\n{self.log()}")
            ready, _, _ = select.select([self.proc.stdout], [], [], min(left, 0.5))
            if ready:
                chunk = os.read(self.proc.stdout.fileno(), 65536)
                if not chunk:
                    raise AssertionError(f"gRPC client exited:\n{self.log()}")
                line += chunk
        answer = json.loads(line)
        return Counter(answer["names"]), Counter(answer["errors"])

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-8000:]
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(OSError):
                assert self.proc.stdin is not None
                self.proc.stdin.close()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self._log.close()


def _serve_orders() -> None:
    """The client process: one channel per target, orders from stdin, answers to stdout."""
    channels: dict[str, grpc.Channel] = {}
    try:
        for line in sys.stdin:
            order = json.loads(line)
            target = order["target"]
            if target not in channels:
                channels[target] = grpc.insecure_channel(target)
            call = channels[target].unary_unary(METHOD_PATH)
            metadata = tuple((k, v) for k, v in order["metadata"])
            names: Counter[str] = Counter()
            errors: Counter[str] = Counter()
            for _ in range(int(order["calls"])):
                try:
                    # wait_for_ready: the first call waits for xDS instead of failing fast.
                    answer = call(b"", metadata=metadata, timeout=CALL_TIMEOUT, wait_for_ready=True)
                    names[answer.decode()] += 1
                except grpc.RpcError as err:
                    errors[err.code().name] += 1
                    print(f"call to {target} failed: {err}", file=sys.stderr, flush=True)
            sys.stdout.write(json.dumps({"names": names, "errors": errors}) + "\n")
            sys.stdout.flush()
    finally:
        for channel in channels.values():
            channel.close()


def xds_server(workdir: Path, name: str, host: str, port: int, bootstrap_path: Path) -> GrpcClient:
    """An xDS-enabled NameServer in its own process (its own bootstrap), stopped like a client."""
    return GrpcClient(
        workdir,
        name,
        bootstrap_path,
        trace="xds_server_config_fetcher",
        args=["--serve", name, host, str(port)],
    )


def _serve_as_xds_server(name: str, host: str, port: int) -> None:
    server = NameServer(name, host, port, xds=True).start()
    try:
        sys.stdin.read()  # until the test closes stdin
    finally:
        server.stop()


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"]:
        _serve_as_xds_server(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    else:
        _serve_orders()
