"""Istio configuration objects as the rest of meshpilot sees them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from meshpilot.model.kind import Kind


@dataclass(frozen=True, slots=True)
class ConfigKey:
    """Identifies one config object; also the unit of push scoping.

    Service changes use ``Kind.SERVICE_ENTRY`` with the service hostname as the
    name, whichever registry the service came from, as istiod does.
    """

    kind: Kind
    name: str
    namespace: str = ""

    def __str__(self) -> str:
        return f"{self.kind.value}/{self.namespace}/{self.name}"

    def sort_key(self) -> tuple[str, str, str]:
        return (self.kind.value, self.namespace, self.name)


@dataclass(frozen=True, slots=True)
class ConfigMeta:
    kind: Kind
    name: str
    namespace: str
    #: The apiVersion it was written with (any accepted version parses the same).
    api_version: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    resource_version: str = ""
    generation: int = 0
    #: RFC 3339 text as Kubernetes writes it; "" when unknown. Older wins conflicts.
    creation_timestamp: str = ""

    @property
    def key(self) -> ConfigKey:
        return ConfigKey(self.kind, self.name, self.namespace)


@dataclass(frozen=True, slots=True)
class Config:
    """An Istio config object: metadata and the parsed protobuf spec.

    The spec is a protobuf message; nothing mutates it after parsing.
    """

    meta: ConfigMeta
    spec: Any
    #: Stable hash of the spec, used to skip updates that change nothing.
    spec_hash: int = 0

    @property
    def key(self) -> ConfigKey:
        return self.meta.key

    @property
    def kind(self) -> Kind:
        return self.meta.kind

    @property
    def name(self) -> str:
        return self.meta.name

    @property
    def namespace(self) -> str:
        return self.meta.namespace
