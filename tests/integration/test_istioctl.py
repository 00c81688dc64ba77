"""Istio's own istioctl against a real ``meshpilot discovery`` and two Envoys: proxy-status (the table
and the per-proxy diff with Envoy's admin config dump), version and internal-debug, over the plaintext
port and over the secure port with a client certificate of the mesh."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import pytest
from integration.conftest import MeshHarness
from support import certs
from support.istioctl import Istioctl, mesh_certs
from support.kube import egress_sidecar, workload
from support.processes import Envoy, free_port
from support.wait import eventually

from meshpilot import __version__

pytestmark = [pytest.mark.envoy, pytest.mark.integration, pytest.mark.reference]

PODS = {
    "reviews-v1": ("reviews", "127.0.0.31", "127.0.1.31"),
    "ratings-v1": ("ratings", "127.0.0.32", "127.0.1.32"),
}
ISTIOD_POD = "istiod-7d4c9-x2x9z"
#: What pilot-agent puts in every sidecar's metadata; istiod's sync status lists only such nodes.
PROXY_CONFIG = {"PROXY_CONFIG": {"discoveryAddress": "istiod.istio-system.svc:15012"}}


@pytest.fixture(scope="module")
def mesh(
    tmp_path_factory: pytest.TempPathFactory, ca: certs.TestCA, request: pytest.FixtureRequest
) -> Iterator[MeshHarness]:
    """One meshpilot and two Envoys for the whole module; their logs are printed if a test failed."""
    harness = MeshHarness(tmp_path_factory.mktemp("istioctl"), ca)
    failed = request.session.testsfailed
    try:
        yield harness
    finally:
        harness.close()
        if request.session.testsfailed > failed:
            print(harness.logs())


@pytest.fixture(scope="module")
def live(mesh: MeshHarness) -> tuple[Istioctl, dict[str, Envoy]]:
    docs = []
    for pod, (app, ip, bind) in PODS.items():
        docs += [
            *workload(app, "default", f"10.96.0.{ip.rsplit('.', 1)[1]}", 9080, {pod: ip}),
            egress_sidecar(app, bind),
        ]
    mesh.write("apps.yaml", docs)
    cert_port = free_port()
    # Sync status and config dumps on the plaintext port, as istiod serves them with this switch off.
    mp = mesh.start_meshpilot(
        extra=["--secure-grpc-client-cert-addr", f"127.0.0.1:{cert_port}", "--no-debug-endpoint-auth"],
        env={"POD_NAME": ISTIOD_POD},
    )
    envoys = {
        pod: mesh.sidecar(pod, ip, labels={"app": app}, extra_metadata=PROXY_CONFIG)
        for pod, (app, ip, _) in PODS.items()
    }
    return Istioctl(mesh.tmp, mp, mesh_certs(mp, mesh.tmp / "istioctl-certs"), cert_port), envoys


def _rows(output: str) -> dict[str, list[str]]:
    return {
        line.split()[0]: re.split(r"\s{2,}", line.strip()) for line in output.splitlines()[1:] if line.strip()
    }


def _synced(istioctl: Istioctl, *, secure: bool = False) -> dict[str, list[str]]:
    def all_synced() -> dict[str, list[str]] | None:
        rows = _rows(istioctl.run("proxy-status", "-v", "1", secure=secure))
        wanted = {f"{pod}.default" for pod in PODS}
        if set(rows) != wanted:
            return None
        ok = all(cell.startswith(("SYNCED", "IGNORED")) for row in rows.values() for cell in row[2:-2])
        return rows if ok else None

    return eventually(all_synced, what="every proxy SYNCED in istioctl proxy-status")


def test_proxy_status_lists_every_proxy_synced(live) -> None:
    istioctl, _ = live
    rows = _synced(istioctl)
    for row in rows.values():
        # NAME CLUSTER CDS LDS EDS RDS ECDS ISTIOD VERSION
        assert row[1] == "Kubernetes"
        assert row[-2:] == [ISTIOD_POD, "1.28.0"]
    table = _rows(istioctl.run("proxy-status"))
    # NAME CLUSTER ISTIOD VERSION SUBSCRIBED TYPES
    assert all(
        row[1:] == ["Kubernetes", ISTIOD_POD, "1.28.0", "4 (CDS,LDS,EDS,RDS)"] for row in table.values()
    )


def test_proxy_status_diff_is_empty_after_a_push(live, mesh: MeshHarness) -> None:
    istioctl, envoys = live
    # A change every proxy gets, then the diff once both have it.
    mesh.write("more.yaml", workload("details", "default", "10.96.0.40", 9080, {"details-v1": "127.0.0.40"}))

    def has_details() -> bool:
        return all(
            b"details.default.svc.cluster.local" in e.admin("/config_dump")[1] for e in envoys.values()
        )

    eventually(has_details, what="details pushed to both proxies")
    _synced(istioctl)
    for pod, envoy in envoys.items():
        status, dump = envoy.admin("/config_dump")
        assert status == 200
        path = istioctl.mp.ca_dir.parent / f"{pod}-envoy-dump.json"
        path.write_bytes(dump)
        out = istioctl.run("proxy-status", f"{pod}.default", "--file", str(path))
        assert "Clusters Match" in out and "Listeners Match" in out and "Routes Match" in out, out


def test_version_reports_the_control_plane(live) -> None:
    istioctl, _ = live
    # ``x version`` asks over xDS (``version`` reads the istiod pods from the API server).
    out = json.loads(istioctl.run("x", "version", "-o", "json"))
    [server] = out["meshVersion"]
    assert server["Component"] == "istiod"
    assert server["Revision"] == "default"
    assert server["Info"]["version"] == __version__
    proxies = {p["ID"]: p["IstioVersion"] for p in out["dataPlaneVersion"]}
    assert proxies == {f"{pod}.default": "1.28.0" for pod in PODS}


def test_secure_port_serves_sync_status_and_internal_debug(live) -> None:
    istioctl, _ = live
    rows = _synced(istioctl, secure=True)
    assert set(rows) == {f"{pod}.default" for pod in PODS}
    syncz = json.loads(istioctl.run("x", "internal-debug", "syncz", secure=True))
    assert {s["proxy"] for s in syncz} >= {f"{pod}.default" for pod in PODS}
    listed = json.loads(istioctl.run("x", "internal-debug", "--list", secure=True))
    assert "connections" in listed and "syncz" in listed


def test_internal_debug_needs_an_identity(live) -> None:
    istioctl, _ = live
    out = istioctl.run("x", "internal-debug", "syncz", check=False)
    assert "authentication required" in out
