"""Istio's own injector as referee: every golden pod without a config of its own (mesh ``defaultConfig``
cases included) goes through ``istioctl kube-inject`` (build/reference/bin) with the case's mesh, Istio's
chart ``injection-template.yaml`` and the chart's values, and through meshpilot's injection with the
same mesh, once with the built-in template and once with the chart's template on meshpilot's engine;
the three pods must agree (modulo Go's typed-Pod normalisation), skips included."""

from __future__ import annotations

import copy
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.reference import binary, istio_file

from meshpilot.model.mesh import apply_mesh_config
from meshpilot.webhooks.inject.config import InjectionError, parse_config
from meshpilot.webhooks.inject.inject import inject_pod
from meshpilot.webhooks.inject.quantity import canonical_quantity

CHART = "manifests/charts/istio-control/istio-discovery"
CASES = Path(__file__).parent / "cases"
# Pods istioctl treats apart from the webhook meshpilot is: a bad annotation (another message), an
# already injected pod and a pod in istiod's own namespace (istioctl injects both; the webhook skips).
NOT_COMPARED = {"error-bad-ports", "skip-already-injected", "skip-istio-namespace"}
PODS = sorted(
    p
    for p in CASES.glob("*.yaml")
    if not p.name.endswith(".golden.yaml")
    and "config" not in yaml.safe_load(p.read_text())
    and p.stem not in NOT_COMPARED
)


def _chart_values() -> dict[str, Any]:
    values: dict[str, Any] = yaml.safe_load(istio_file(f"{CHART}/values.yaml"))[
        "_internal_defaults_do_not_set"
    ]
    values["pilot"] = {"cni": values.get("cni", {})}
    values["global"].update({"hub": "docker.io/istio", "tag": "1.28.0"})
    return values


def _normalise(pod: dict[str, Any]) -> dict[str, Any]:
    """Go's typed Pod on the way out: empty ``status``/``resources`` written as ``{}``, a zero
    ``initialDelaySeconds`` left out, quantities canonical."""
    pod = copy.deepcopy(pod)
    pod.pop("status", None)
    pod["metadata"].pop("creationTimestamp", None)
    for key in ("containers", "initContainers"):
        for container in pod["spec"].get(key, []):
            if container.get("resources") == {}:
                del container["resources"]
            for probe in ("readinessProbe", "startupProbe", "livenessProbe"):
                if container.get(probe, {}).get("initialDelaySeconds") == 0:
                    del container[probe]["initialDelaySeconds"]
            for group in container.get("resources", {}).values():
                for resource, quantity in group.items():
                    group[resource] = canonical_quantity(str(quantity), resource)
    return pod


def _istioctl(case: dict[str, Any], tmp_path: Path, template: str, values: str) -> dict[str, Any]:
    (tmp_path / "mesh.yaml").write_text(yaml.safe_dump(case.get("mesh") or {}))
    (tmp_path / "pod.yaml").write_text(yaml.safe_dump(case["pod"]))
    (tmp_path / "config.yaml").write_text(
        yaml.safe_dump({"policy": "enabled", "templates": {"sidecar": template}})
    )
    (tmp_path / "values.yaml").write_text(values)
    # ``-r default`` keeps istioctl from asking a cluster for the default revision.
    done = subprocess.run(
        [
            str(binary("istioctl")), "kube-inject", "-r", "default",
            "-f", str(tmp_path / "pod.yaml"),
            "--meshConfigFile", str(tmp_path / "mesh.yaml"),
            "--injectConfigFile", str(tmp_path / "config.yaml"),
            "--valuesFile", str(tmp_path / "values.yaml"),
        ],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (pod,) = [d for d in yaml.safe_load_all(done.stdout) if d]
    return _normalise(pod)


@pytest.mark.reference
@pytest.mark.parametrize("path", PODS, ids=[p.stem for p in PODS])
def test_meshpilot_injects_what_istioctl_injects(path: Path, tmp_path: Path) -> None:
    case = yaml.safe_load(path.read_text())
    template = istio_file(f"{CHART}/files/injection-template.yaml")
    values = yaml.safe_dump(_chart_values())
    expected = _istioctl(case, tmp_path, template, values)
    mesh = apply_mesh_config(yaml.safe_dump(case["mesh"])) if "mesh" in case else None
    pod = case["pod"]
    namespace = pod["metadata"].get("namespace", "default")
    for config in (
        parse_config("{}", values),
        parse_config(yaml.safe_dump({"templates": {"sidecar": template}}), values),
    ):
        try:
            injected = inject_pod(copy.deepcopy(pod), namespace, config, mesh=mesh)
        except InjectionError as err:
            pytest.fail(f"meshpilot refused what istioctl injects: {err}")
        # A pod istiod's policy skips comes back from istioctl as it went in.
        assert _normalise(injected if injected is not None else pod) == expected


def test_mesh_cases_are_compared() -> None:
    """The referee covers the mesh ``defaultConfig`` cases, what the effective proxy config is about."""
    assert {"mesh-default-config", "mesh-default-config-annotation"} <= {p.stem for p in PODS}
