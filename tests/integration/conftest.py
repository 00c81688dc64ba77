"""Integration fixtures: a meshpilot process, Envoy sidecars with SDS, loopback backends."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from support.backends import Backend, TcpBackend
from support.certs import TestCA
from support.kube import write
from support.processes import Envoy, Meshpilot, Process, Sds, free_port, sidecar_bootstrap
from support.tls_backend import TlsBackend


@pytest.fixture(scope="session")
def ca() -> TestCA:
    return TestCA()


class MeshHarness:
    """One test's mesh: config directory, meshpilot, sidecars and backends, all cleaned up."""

    def __init__(self, tmp: Path, ca: TestCA) -> None:
        self.tmp = tmp
        self.ca = ca
        self.config_dir = tmp / "config"
        self.config_dir.mkdir()
        self.processes: list[Process] = []
        self.backends: list[Backend | TcpBackend | TlsBackend] = []
        self.meshpilot: Meshpilot | None = None

    def write(self, name: str, docs: list[Mapping[str, Any]]) -> Path:
        return write(self.config_dir / name, docs)

    def remove(self, name: str) -> None:
        (self.config_dir / name).unlink()

    def start_meshpilot(self, *, wait: bool = True, **kwargs: Any) -> Meshpilot:
        """meshpilot on the config directory, or (``config_dir=None, kubeconfig=...``) on an API server."""
        kwargs.setdefault("config_dir", self.config_dir)
        mp = Meshpilot(self.tmp, **kwargs)
        self.processes.append(mp)
        mp.start()
        if wait:
            mp.wait_ready()
        self.meshpilot = mp
        return mp

    def sidecar(
        self,
        pod: str,
        ip: str,
        *,
        namespace: str = "default",
        labels: Mapping[str, str] | None = None,
        service_account: str = "default",
        interception: str = "NONE",
        extra_metadata: Mapping[str, Any] | None = None,
        wait: bool = True,
        locality: str = "",
        node_type: str = "sidecar",
        delta: bool = True,
        xds_port: int | None = None,
    ) -> Envoy:
        """An Envoy as pilot-agent starts it; ``node_type="router"`` makes it a gateway; ``delta=False``
        speaks state-of-the-world ADS instead of delta."""
        assert self.meshpilot is not None, "start meshpilot first"
        credentials = self.ca.issue(
            f"spiffe://cluster.local/ns/{namespace}/sa/{service_account}", self.tmp / pod
        )
        sds = Sds(self.tmp, pod, credentials)
        self.processes.append(sds)
        sds.start()
        sds.wait_listening()
        admin = free_port()
        metadata = {
            "NAMESPACE": namespace,
            "INTERCEPTION_MODE": interception,
            "CLUSTER_ID": "Kubernetes",
            "ISTIO_VERSION": "1.28.0",
            "LABELS": dict(labels or {}),
            **(extra_metadata or {}),
        }
        bootstrap = sidecar_bootstrap(
            node_id=f"{node_type}~{ip}~{pod}.{namespace}~{namespace}.svc.cluster.local",
            metadata=metadata,
            admin_port=admin,
            xds_port=xds_port or self.meshpilot.grpc_port,
            sds_socket=sds.socket,
            locality=locality,
            delta=delta,
        )
        envoy = Envoy(self.tmp, pod, bootstrap, admin)
        self.processes.append(envoy)
        envoy.start()
        if wait:
            envoy.wait_live()
        return envoy

    def backend(
        self,
        name: str,
        host: str,
        port: int,
        *,
        tls: tuple[Path, Path] | None = None,
        client_ca: Path | None = None,
    ) -> Backend:
        backend = Backend(name, host, port, tls=tls, client_ca=client_ca).start()
        self.backends.append(backend)
        return backend

    def tcp_backend(self, name: str, host: str, port: int) -> TcpBackend:
        backend = TcpBackend(name, host, port).start()
        self.backends.append(backend)
        return backend

    def tls_backend(self, name: str, host: str, port: int, names: list[str]) -> TlsBackend:
        """A TLS server, self-signed for ``names``, that answers with its name and the SNI it saw."""
        backend = TlsBackend(name, host, port, names, self.tmp / "tls").start()
        self.backends.append(backend)
        return backend

    def logs(self) -> str:
        return "\n".join(f"===== {p.name} =====\n{p.log()[-6000:]}" for p in self.processes)

    def close(self) -> None:
        for process in reversed(self.processes):
            process.stop(timeout=5)
        for backend in self.backends:
            backend.stop()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if report.when in ("setup", "call") and report.failed:
        item.stash[_FAILED] = True


_FAILED = pytest.StashKey[bool]()


@pytest.fixture
def mesh(tmp_path: Path, ca: TestCA, request: pytest.FixtureRequest) -> Iterator[MeshHarness]:
    harness = MeshHarness(tmp_path, ca)
    try:
        yield harness
    finally:
        harness.close()
        if request.node.stash.get(_FAILED, False):
            print(harness.logs())
