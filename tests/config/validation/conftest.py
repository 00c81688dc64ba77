"""Helpers for validation tests: run a spec through the full decode pipeline."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import yaml

from meshpilot.config import schemas
from meshpilot.config.decode import decode_object
from meshpilot.config.errors import ValidationError
from meshpilot.config.protojson import parse_spec
from meshpilot.config.validation import check_config
from meshpilot.model.config import Config, ConfigMeta

API_VERSIONS = {
    "VirtualService": "networking.istio.io/v1",
    "DestinationRule": "networking.istio.io/v1",
    "Gateway": "networking.istio.io/v1",
    "ServiceEntry": "networking.istio.io/v1",
    "WorkloadEntry": "networking.istio.io/v1",
    "Sidecar": "networking.istio.io/v1",
    "PeerAuthentication": "security.istio.io/v1",
    "AuthorizationPolicy": "security.istio.io/v1",
    "RequestAuthentication": "security.istio.io/v1",
}

# §14's shorthand "R": a route to one destination.
ROUTE = "route: [{destination: {host: foo.baz}}]"


@dataclass
class Outcome:
    errors: list[str]
    warnings: list[str]


def build(
    kind: str,
    spec: str | dict[str, Any],
    *,
    name: str = "x",
    namespace: str = "default",
    annotations: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A raw object as a file or the API server would hand it over; ``spec`` may be YAML text."""
    if isinstance(spec, str):
        spec = yaml.safe_load(spec.replace("$R", ROUTE))
    metadata: dict[str, Any] = {"name": name, "namespace": namespace}
    if annotations:
        metadata["annotations"] = annotations
    if labels:
        metadata["labels"] = labels
    return {"apiVersion": API_VERSIONS[kind], "kind": kind, "metadata": metadata, "spec": spec}


def _warnings_of_rejected(raw: dict[str, Any]) -> list[str]:
    """The warnings istiod would return next to the errors (decode_object only raises)."""
    schema = schemas.lookup(raw["apiVersion"], raw["kind"])
    spec = schema.new_spec()
    parse_spec(raw["spec"], spec)
    metadata = raw["metadata"]
    meta = ConfigMeta(
        kind=schema.kind,
        name=metadata["name"],
        namespace=metadata["namespace"],
        labels=metadata.get("labels", {}),
        annotations=metadata.get("annotations", {}),
    )
    return check_config(Config(meta, spec)).warnings


def run(kind: str, spec: str | dict[str, Any], **meta: Any) -> Outcome:
    """Decode and validate; the errors (empty when accepted) and warnings."""
    raw = build(kind, spec, **meta)
    try:
        result = decode_object(raw)
    except ValidationError as err:
        return Outcome(list(err.errors), _warnings_of_rejected(raw))
    return Outcome([], list(result.warnings))


@pytest.fixture(autouse=True)
def _default_feature_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    """Expected outcomes assume istiod's default flags, whatever the environment says."""
    monkeypatch.delenv("PILOT_ENABLE_IP_AUTOALLOCATE", raising=False)


@pytest.fixture
def validate() -> Callable[..., Outcome]:
    """``validate(kind, spec, name=..., annotations=...)`` -> Outcome."""
    return run
