"""Golden cases: each ``cases/NAME.yaml`` (a pod, optional injector ``config``, optional ``mesh``:
the server's MeshConfig) goes through
``handle_inject`` as an AdmissionReview; the returned JSON patch is applied to the pod and the result
compared with ``cases/NAME.golden.yaml``. ``UPDATE_GOLDEN=1`` rewrites the goldens."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
import yaml

from meshpilot.model.mesh import apply_mesh_config
from meshpilot.webhooks.inject.config import InjectConfig, parse_config
from meshpilot.webhooks.inject.review import handle_inject

CASES = Path(__file__).parent / "cases"
INPUTS = sorted(p for p in CASES.glob("*.yaml") if not p.name.endswith(".golden.yaml"))


def _run(case: dict[str, Any]) -> dict[str, Any]:
    config = parse_config(case["config"]) if "config" in case else InjectConfig()
    mesh = apply_mesh_config(yaml.safe_dump(case["mesh"])) if "mesh" in case else None
    pod = case["pod"]
    review = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {"uid": "u-1", "namespace": pod["metadata"].get("namespace", ""), "object": pod},
    }
    response = handle_inject(review, config, mesh=mesh)["response"]
    result: dict[str, Any] = {"allowed": response["allowed"]}
    if "patch" in response:
        assert response["patchType"] == "JSONPatch"
        patch = json.loads(base64.b64decode(response["patch"]))
        result["pod"] = jsonpatch.apply_patch(pod, patch)
    else:
        result["patched"] = False
    if "status" in response:
        result["message"] = response["status"]["message"]
    return result


def test_there_are_enough_cases() -> None:
    assert len(INPUTS) >= 12


@pytest.mark.parametrize("path", INPUTS, ids=[p.stem for p in INPUTS])
def test_golden(path: Path) -> None:
    case = yaml.safe_load(path.read_text())
    got = _run(case)
    golden = path.with_name(path.stem + ".golden.yaml")
    if os.environ.get("UPDATE_GOLDEN") == "1":
        golden.write_text(yaml.safe_dump(got, sort_keys=True, default_flow_style=False))
    assert golden.exists(), f"no golden for {path.name}; run with UPDATE_GOLDEN=1"
    assert got == yaml.safe_load(golden.read_text())
