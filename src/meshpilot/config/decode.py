"""Decoding one object (a JSON-like dict) into a Config or a core Kubernetes object.

Files and the Kubernetes API both end here, so one object gives the same
result whichever way it arrives.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from meshpilot.config import core_objects, schemas
from meshpilot.config.errors import ConfigError
from meshpilot.config.protojson import parse_spec
from meshpilot.config.validation import validate_config
from meshpilot.model.config import Config, ConfigMeta
from meshpilot.model.confighash import hash_bytes

Decoded = Config | core_objects.KubeObject


@dataclass(frozen=True, slots=True)
class DecodeResult:
    obj: Decoded
    warnings: list[str] = field(default_factory=list)


def identify(raw: dict[str, Any]) -> tuple[str, str, str]:
    """(kind, namespace, name) as written, for messages about objects that fail to decode."""
    meta = raw.get("metadata")
    meta = meta if isinstance(meta, dict) else {}
    return (str(raw.get("kind", "")), str(meta.get("namespace", "") or ""), str(meta.get("name", "") or ""))


def decode_object(raw: dict[str, Any], *, default_namespace: str = "default") -> DecodeResult:
    """Parse and validate one object; ConfigError says what is wrong and where."""
    api_version = raw.get("apiVersion")
    kind = raw.get("kind")
    if not isinstance(kind, str) or not kind:
        raise ConfigError("kind is required", "kind")
    if not isinstance(api_version, str) or not api_version:
        raise ConfigError("apiVersion is required", "apiVersion")
    schema = schemas.lookup(api_version, kind)
    if schema.parse_core is not None:
        if schema.cluster_scoped:
            return DecodeResult(schema.parse_core(raw))
        return DecodeResult(schema.parse_core(raw, default_namespace))
    core_meta = core_objects.parse_meta(raw, namespaced=True, default_namespace=default_namespace)
    spec = schema.new_spec()
    parse_spec(raw.get("spec"), spec)
    meta = ConfigMeta(
        kind=schema.kind,
        name=core_meta.name,
        namespace=core_meta.namespace,
        api_version=api_version,
        labels=core_meta.labels,
        annotations=core_meta.annotations,
        resource_version=core_meta.resource_version,
        generation=_generation(raw),
        creation_timestamp=core_meta.creation_timestamp,
    )
    config = Config(meta, spec, hash_bytes(spec.SerializeToString(deterministic=True)))
    warnings = validate_config(config)
    return DecodeResult(config, warnings)


def _generation(raw: dict[str, Any]) -> int:
    meta = raw.get("metadata")
    value = meta.get("generation", 0) if isinstance(meta, dict) else 0
    return value if isinstance(value, int) and not isinstance(value, bool) else 0
