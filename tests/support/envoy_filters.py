"""EnvoyFilters for tests: objects as a user writes them, and their patches ready to apply."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import Message

from meshpilot.config.decode import decode_object
from meshpilot.model.config import Config
from meshpilot.networking.envoyfilter.patches import PatchSet, convert


def envoy_filter(
    name: str,
    namespace: str,
    patches: Sequence[Mapping[str, Any]],
    *,
    selector: Mapping[str, str] | None = None,
    priority: int = 0,
    created: str = "",
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """An EnvoyFilter object (``v1alpha3``, the version users write)."""
    spec: dict[str, Any] = {"configPatches": list(patches), **(extra or {})}
    if selector is not None:
        spec["workloadSelector"] = {"labels": dict(selector)}
    if priority:
        spec["priority"] = priority
    metadata: dict[str, Any] = {"name": name, "namespace": namespace}
    if created:
        metadata["creationTimestamp"] = created
    return {
        "apiVersion": "networking.istio.io/v1alpha3",
        "kind": "EnvoyFilter",
        "metadata": metadata,
        "spec": spec,
    }


def config_of(obj: Mapping[str, Any]) -> Config:
    decoded = decode_object(dict(obj)).obj
    assert isinstance(decoded, Config), decoded
    return decoded


def patch_set(*patches: Mapping[str, Any], name: str = "test") -> PatchSet:
    """The patches of one EnvoyFilter, all applying (no proxy match is checked here)."""
    converted = convert(config_of(envoy_filter(name, "default", patches)))
    assert all(p is not None for p in converted), "every patch converts"
    return PatchSet([p for p in converted if p is not None])


def message(message_type: type[Message], data: Mapping[str, Any]) -> Any:
    return json_format.ParseDict(dict(data), message_type())


def as_dict(msg: Message) -> dict[str, Any]:
    return json_format.MessageToDict(msg, preserving_proto_field_name=True)
