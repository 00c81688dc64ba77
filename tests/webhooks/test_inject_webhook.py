"""``/inject`` over real HTTPS on a ``meshpilot discovery`` process, with ``--inject-config`` watched.

The client verifies the server certificate (issued by the test CA). The
answer's JSON patch, applied to the pod sent, must give the injected pod the
golden cases describe; a changed injector config takes effect for the next
pod, and a broken one leaves the last good config serving.
"""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
from support import certs
from support.processes import Meshpilot, free_port
from support.wait import eventually
from webhooks.test_validate_webhook import HOST, Client, issue_serving_cert

POD: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "hello", "namespace": "default", "labels": {"app": "hello"}},
    "spec": {"containers": [{"name": "hello", "image": "hello:1", "ports": [{"containerPort": 80}]}]},
}


def _review(pod: dict[str, Any], api_version: str = "admission.k8s.io/v1") -> dict[str, Any]:
    request = {
        "uid": str(uuid.uuid4()),
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "namespace": pod["metadata"]["namespace"],
        "operation": "CREATE",
        "object": pod,
    }
    return {"apiVersion": api_version, "kind": "AdmissionReview", "request": request}


def _injected(answer: dict[str, Any], pod: dict[str, Any]) -> dict[str, Any]:
    response = answer["response"]
    assert response["allowed"] is True, response
    assert response["patchType"] == "JSONPatch"
    patch = json.loads(base64.b64decode(response["patch"]))
    result: dict[str, Any] = jsonpatch.apply_patch(pod, patch)
    return result


def _write_config(directory: Path, policy: str) -> None:
    directory.mkdir(exist_ok=True)
    (directory / "config").write_text(f"policy: {policy}\n")


@pytest.fixture(scope="module")
def injector(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Meshpilot, Client, Path]]:
    workdir = tmp_path_factory.mktemp("inject")
    ca = certs.TestCA()
    cert_file, key_file = issue_serving_cert(ca, workdir / "tls")
    config = workdir / "config"
    config.mkdir()
    inject_dir = workdir / "inject"
    _write_config(inject_dir, "enabled")
    port = free_port(HOST)
    extra = ["--webhook-addr", f"{HOST}:{port}", "--tls-cert-file", str(cert_file)]
    extra += ["--tls-key-file", str(key_file), "--inject-config", str(inject_dir)]
    proc = Meshpilot(workdir, config, extra=extra)
    proc.start()
    try:
        proc.wait_ready()
        yield proc, Client(port, ca.root_pem.decode()), inject_dir
    finally:
        proc.stop()


def test_a_pod_gets_the_sidecar_and_the_init_container(injector) -> None:
    proc, client, _ = injector
    before = proc.metric("sidecar_injection_success_total")
    sent = _review(POD)
    answer = client.review(sent, path="/inject")
    assert answer["response"]["uid"] == sent["request"]["uid"]
    pod = _injected(answer, POD)
    assert [c["name"] for c in pod["spec"]["containers"]] == ["hello", "istio-proxy"]
    [init] = pod["spec"]["initContainers"]
    assert init["name"] == "istio-init"
    args = init["args"]
    for flag, value in (("-p", "15001"), ("-z", "15006"), ("-u", "1337"), ("-m", "REDIRECT")):
        assert args[args.index(flag) + 1] == value
    assert args[args.index("-d") + 1] == "15090,15021,15020"
    assert pod["metadata"]["labels"]["security.istio.io/tlsMode"] == "istio"
    assert "sidecar.istio.io/status" in pod["metadata"]["annotations"]
    assert proc.metric("sidecar_injection_success_total") == before + 1
    assert proc.metric("sidecar_injection_time_seconds_count") >= 1


def test_v1beta1_and_skips_are_answered_without_a_patch(injector) -> None:
    _, client, _ = injector
    answer = client.review(_review(POD, "admission.k8s.io/v1beta1"), path="/inject")
    assert answer["apiVersion"] == "admission.k8s.io/v1beta1"
    _injected(answer, POD)
    host_network = json.loads(json.dumps(POD))
    host_network["spec"]["hostNetwork"] = True
    skipped = client.review(_review(host_network), path="/inject")["response"]
    assert skipped["allowed"] is True and "patch" not in skipped


def test_a_changed_config_applies_to_the_next_pod_and_a_broken_one_is_ignored(injector) -> None:
    proc, client, inject_dir = injector

    def patched() -> bool:
        return "patch" in client.review(_review(POD), path="/inject")["response"]

    assert patched()
    # Policy disabled: a pod that does not opt in is left alone.
    _write_config(inject_dir, "disabled")
    eventually(lambda: not patched(), timeout=10, what="policy disabled to take effect")
    opted_in = json.loads(json.dumps(POD))
    opted_in["metadata"]["labels"]["sidecar.istio.io/inject"] = "true"
    assert "patch" in client.review(_review(opted_in), path="/inject")["response"]
    # A config that does not parse keeps the last good one (still disabled).
    (inject_dir / "config").write_text("policy: [not, a, policy\n")
    eventually(lambda: "not reloaded" in proc.log(), timeout=10, what="the broken config to be refused")
    assert not patched()
    _write_config(inject_dir, "enabled")
    eventually(patched, timeout=10, what="policy enabled again")


def test_a_bad_inject_config_stops_discovery_with_a_clear_message(tmp_path: Path) -> None:
    inject_dir = tmp_path / "inject"
    inject_dir.mkdir()
    (inject_dir / "config").write_text("policy: [broken\n")
    config = tmp_path / "config"
    config.mkdir()
    proc = Meshpilot(tmp_path, config, extra=["--inject-config", str(inject_dir)])
    proc.start()
    try:
        code = proc.proc.wait(timeout=30) if proc.proc is not None else None
    finally:
        proc.stop()
    assert code == 2
    assert "--inject-config" in proc.log()
