"""Real processes for integration tests: meshpilot, Envoy and the agent's SDS server.

Every process logs to a file under the test's temporary directory, so a
failing test can show what each one said.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import subprocess
import sys
import sysconfig
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from support.certs import Credentials
from support.wait import eventually

from bench.server import free_port

ENVOY_BIN = Path(sysconfig.get_paths()["purelib"]) / "envoy" / "_bin" / "envoy"


def http_get(
    host: str,
    port: int,
    path: str,
    headers: Mapping[str, str] | None = None,
    timeout: float = 5.0,
    method: str = "GET",
) -> tuple[int, bytes, dict[str, str]]:
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request(method, path, headers=dict(headers or {}))
        response = conn.getresponse()
        return response.status, response.read(), {k.lower(): v for k, v in response.getheaders()}
    finally:
        conn.close()


def backend_name(
    ip: str, host: str, port: int = 9080, headers: Mapping[str, str] | None = None
) -> tuple[int, str]:
    """A request through a sidecar's listener: (status, the answering backend's name, else the body)."""
    status, body, _ = http_get(ip, port, "/", {"Host": host, **(headers or {})})
    if status == 200:
        return status, str(json.loads(body)["name"])
    return status, body.decode(errors="replace")


class Process:
    """A subprocess with a log file, stopped politely then firmly."""

    def __init__(
        self, name: str, argv: Sequence[str], log: Path, env: Mapping[str, str] | None = None
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log
        self.env = {**os.environ, **(env or {})}
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        out = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            self.argv, stdout=out, stderr=subprocess.STDOUT, env=self.env, start_new_session=True
        )
        out.close()

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM, then SIGKILL after ``timeout``; returns the exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        return self.proc.returncode

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""


class Meshpilot(Process):
    def __init__(
        self,
        workdir: Path,
        config_dir: Path | None,
        *,
        mesh_config: Path | None = None,
        kubeconfig: Path | None = None,
        log_name: str = "meshpilot.log",
        env: Mapping[str, str] | None = None,
        extra: Sequence[str] = (),
        debounce: str = "50ms",
    ) -> None:
        self.grpc_port = free_port()
        self.http_port = free_port()
        self.monitoring_port = free_port()
        self.webhook_port = free_port()
        self.secure_grpc_port = free_port()
        #: The mesh CA's self-signed root, kept here (``root-cert.pem``) for clients to trust.
        self.ca_dir = workdir / "meshpilot-ca"
        argv = [
            sys.executable,
            "-m",
            "meshpilot.cli.main",
            "discovery",
            *(["--config-dir", str(config_dir)] if config_dir is not None else []),
            *(["--kubeconfig", str(kubeconfig)] if kubeconfig is not None else []),
            "--grpc-addr",
            f"127.0.0.1:{self.grpc_port}",
            "--http-addr",
            f"127.0.0.1:{self.http_port}",
            "--monitoring-addr",
            f"127.0.0.1:{self.monitoring_port}",
            # Each process its own port: the default :15017 would clash between tests.
            "--webhook-addr",
            f"127.0.0.1:{self.webhook_port}",
            "--secure-grpc-addr",
            f"127.0.0.1:{self.secure_grpc_port}",
            "--self-signed-ca-dir",
            str(self.ca_dir),
            "--debounce-after",
            debounce,
            "--log-level",
            "debug",
            # One process unless a test asks for workers (``extra`` comes later and wins): the
            # command's default, one worker per core, would make every server here a pool, twice
            # the processes and start-up time. $MESHPILOT_TEST_PUSH_WORKERS=2 runs the suites with
            # every server a pool of two.
            "--push-workers",
            os.environ.get("MESHPILOT_TEST_PUSH_WORKERS", "1"),
            *extra,
        ]
        if mesh_config is not None:
            argv += ["--mesh-config", str(mesh_config)]
        super().__init__("meshpilot", argv, workdir / log_name, env)

    def wait_ready(self, timeout: float = 30.0) -> None:
        def ready() -> bool:
            if not self.running:
                raise AssertionError(f"meshpilot exited:\n{self.log()}")
            return self.get("/ready")[0] == 200

        eventually(ready, timeout=timeout, what="meshpilot /ready")

    def get(self, path: str, port: int | None = None) -> tuple[int, bytes]:
        status, body, _ = http_get("127.0.0.1", port or self.http_port, path)
        return status, body

    def get_json(self, path: str) -> Any:
        status, body = self.get(path)
        assert status == 200, f"{path}: HTTP {status}: {body!r}"
        return json.loads(body)

    def metrics(self) -> dict[str, float]:
        """Samples of /metrics, keyed by the sample as written (name and labels)."""
        status, body = self.get("/metrics", self.monitoring_port)
        assert status == 200
        out = {}
        for line in body.decode().splitlines():
            if line and not line.startswith("#"):
                key, _, value = line.rpartition(" ")
                out[key] = float(value)
        return out

    def metric(self, key: str) -> float:
        return self.metrics().get(key, 0.0)


def sidecar_bootstrap(
    *,
    node_id: str,
    metadata: Mapping[str, Any],
    admin_port: int,
    xds_port: int,
    sds_socket: Path | None,
    locality: str = "",
    delta: bool = True,
) -> dict[str, Any]:
    """The bootstrap pilot-agent writes, pointed straight at meshpilot's plaintext port.

    ``delta``: ADS over ``DELTA_GRPC``, pilot-agent's default since Istio 1.22; False for
    state-of-the-world (``ISTIO_DELTA_XDS=false``).

    ``locality`` (``region/zone/subzone``) becomes the node's locality, as pilot-agent
    writes it from the Pod's topology.
    """
    h2 = {
        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
            "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
            "explicit_http_config": {"http2_protocol_options": {}},
        }
    }
    clusters: list[dict[str, Any]] = [
        {
            "name": "xds-grpc",
            "type": "STATIC",
            "connect_timeout": "1s",
            "typed_extension_protocol_options": h2,
            "load_assignment": {
                "cluster_name": "xds-grpc",
                "endpoints": [
                    {
                        "lb_endpoints": [
                            {
                                "endpoint": {
                                    "address": {
                                        "socket_address": {"address": "127.0.0.1", "port_value": xds_port}
                                    }
                                }
                            }
                        ]
                    }
                ],
            },
        }
    ]
    if sds_socket is not None:
        clusters.append(
            {
                "name": "sds-grpc",
                "type": "STATIC",
                "connect_timeout": "1s",
                "typed_extension_protocol_options": h2,
                "load_assignment": {
                    "cluster_name": "sds-grpc",
                    "endpoints": [
                        {"lb_endpoints": [{"endpoint": {"address": {"pipe": {"path": str(sds_socket)}}}}]}
                    ],
                },
            }
        )
    node: dict[str, Any] = {
        "id": node_id,
        "cluster": node_id.split("~")[2].split(".")[0],
        "metadata": dict(metadata),
    }
    if locality:
        region, zone, subzone = ([*locality.split("/"), "", ""])[:3]
        node["locality"] = {"region": region, "zone": zone, "sub_zone": subzone}
    return {
        "node": node,
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": admin_port}}},
        "dynamic_resources": {
            "ads_config": {
                "api_type": "DELTA_GRPC" if delta else "GRPC",
                "transport_api_version": "V3",
                "set_node_on_first_message_only": True,
                "grpc_services": [{"envoy_grpc": {"cluster_name": "xds-grpc"}}],
            },
            "cds_config": {"ads": {}, "initial_fetch_timeout": "0s", "resource_api_version": "V3"},
            "lds_config": {"ads": {}, "initial_fetch_timeout": "0s", "resource_api_version": "V3"},
        },
        "static_resources": {"clusters": clusters},
    }


class Envoy(Process):
    def __init__(self, workdir: Path, name: str, bootstrap: Mapping[str, Any], admin_port: int) -> None:
        self.admin_port = admin_port
        config = workdir / f"{name}-bootstrap.yaml"
        workdir.mkdir(parents=True, exist_ok=True)
        config.write_text(yaml.safe_dump(dict(bootstrap)))
        argv = [
            str(ENVOY_BIN),
            "-c",
            str(config),
            "--concurrency",
            "1",
            "--disable-hot-restart",
            "-l",
            "warning",
            "--component-log-level",
            "config:info,upstream:info",
        ]
        super().__init__(f"envoy-{name}", argv, workdir / f"envoy-{name}.log")

    def admin(self, path: str) -> tuple[int, bytes]:
        status, body, _ = http_get("127.0.0.1", self.admin_port, path)
        return status, body

    def wait_live(self, timeout: float = 30.0) -> None:
        def live() -> bool:
            if not self.running:
                raise AssertionError(f"{self.name} exited:\n{self.log()}")
            return self.admin("/ready")[1].strip() == b"LIVE"

        eventually(live, timeout=timeout, what=f"{self.name} LIVE")

    def stats(self) -> dict[str, int]:
        status, body = self.admin("/stats")
        assert status == 200
        out = {}
        for line in body.decode().splitlines():
            key, sep, value = line.rpartition(": ")
            if sep and value.strip().lstrip("-").isdigit():
                out[key] = int(value)
        return out

    def rejected_updates(self) -> dict[str, int]:
        """Every ``*.update_rejected`` counter that is not zero."""
        return {k: v for k, v in self.stats().items() if k.endswith("update_rejected") and v}

    def config_dump(self, include_eds: bool = False) -> dict[str, Any]:
        status, body = self.admin("/config_dump?include_eds" if include_eds else "/config_dump")
        assert status == 200
        return json.loads(body)

    def dynamic_clusters(self) -> set[str]:
        dump = self.config_dump()
        for config in dump["configs"]:
            if config["@type"].endswith("ClustersConfigDump"):
                return {c["cluster"]["name"] for c in config.get("dynamic_active_clusters", [])}
        return set()

    def endpoints(self, cluster: str) -> list[str]:
        """``ip:port`` of the cluster's hosts as Envoy's /clusters reports them."""
        status, body = self.admin("/clusters")
        assert status == 200
        hosts = set()
        prefix = f"{cluster}::"
        for line in body.decode().splitlines():
            if line.startswith(prefix):
                rest = line[len(prefix) :]
                host = rest.split("::", 1)[0]
                if host[:1].isdigit():
                    hosts.add(host)
        return sorted(hosts)


class Sds(Process):
    def __init__(self, workdir: Path, name: str, credentials: Credentials) -> None:
        self.socket = workdir / f"{name}-sds.sock"
        argv = [
            sys.executable,
            "-m",
            "meshpilot.cli.main",
            "agent",
            "sds",
            "--address",
            f"unix://{self.socket}",
            "--cert-chain",
            str(credentials.cert_chain),
            "--key",
            str(credentials.key),
            "--root-cert",
            str(credentials.root_cert),
        ]
        super().__init__(f"sds-{name}", argv, workdir / f"sds-{name}.log")

    def wait_listening(self, timeout: float = 15.0) -> None:
        eventually(lambda: self.socket.exists(), timeout=timeout, what=f"{self.name} socket")
