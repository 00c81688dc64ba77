"""PeerAuthentication resolved as istiod resolves it: the mutual TLS mode of a workload's port.

istiod (``pilot/pkg/model/authentication.go``, ``pilot/pkg/security/authn``):

- Policies are taken oldest first: creation time, then name, then namespace.
- A policy without a selector (or with empty ``matchLabels``) is namespace-wide; in the root
  namespace (MeshConfig ``rootNamespace``) it is mesh-wide. Only the oldest namespace-wide
  policy of a namespace counts; later ones are ignored (istiod logs them).
- A workload policy is one with a selector, outside the root namespace (a selector in the
  root namespace selects nothing). The oldest one whose labels the workload carries wins.
- Modes are resolved mesh → namespace → workload → port, each UNSET inheriting its parent;
  with nothing set the mode is PERMISSIVE. ``portLevelMtls`` is keyed by the workload's
  (container, target) port; an UNSET port inherits the workload's mode.
- Clients' auto mTLS asks a coarser question (``BestEffortInferServiceMTLSMode``): the
  namespace-wide mode of the service's namespace, else the mesh's, else PERMISSIVE.

Everything here is pure: an index built once per snapshot, and frozen, hashable answers
that serve as cache keys.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from meshpilot.model.config import Config
from meshpilot.model.labels import selector_matches


class MtlsMode(enum.IntEnum):
    """istiod's MutualTLSMode; the numbers are also PeerAuthentication's ``Mode`` numbers."""

    UNKNOWN = 0
    DISABLE = 1
    PERMISSIVE = 2
    STRICT = 3


_EPOCH = datetime.min.replace(tzinfo=UTC)


def _created(config: Config) -> datetime:
    """The creation time; none (a file without one) is Go's zero time, older than any."""
    text = config.meta.creation_timestamp
    if not text:
        return _EPOCH
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        return _EPOCH
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


def istiod_order(config: Config) -> tuple[datetime, str, str]:
    """istiod's configCompareByCreationTime: creation time, then name, then namespace."""
    return (_created(config), config.name, config.namespace)


def _selector(config: Config) -> dict[str, str]:
    spec = config.spec
    return dict(spec.selector.match_labels) if spec.HasField("selector") else {}


def _mode(mtls: Any | None) -> MtlsMode:
    """A MutualTLS message's mode; UNKNOWN for an absent message or UNSET."""
    return MtlsMode(int(mtls.mode)) if mtls is not None else MtlsMode.UNKNOWN


def _spec_mode(config: Config) -> MtlsMode:
    spec = config.spec
    return _mode(spec.mtls if spec.HasField("mtls") else None)


@dataclass(frozen=True, slots=True)
class WorkloadMtls:
    """The effective mTLS of one workload (istiod's MergedPeerAuthentication): hashable, a cache key."""

    mode: MtlsMode = MtlsMode.PERMISSIVE
    #: Port-level overrides, sorted by port, each already resolved (never UNKNOWN).
    per_port: tuple[tuple[int, MtlsMode], ...] = ()

    def for_port(self, port: int) -> MtlsMode:
        for number, mode in self.per_port:
            if number == port:
                return mode
        return self.mode

    @property
    def ports(self) -> tuple[int, ...]:
        return tuple(port for port, _ in self.per_port)


PERMISSIVE_WORKLOAD = WorkloadMtls()


class PeerAuthenticationIndex:
    """The PeerAuthentications of a snapshot, by namespace, in istiod's order."""

    def __init__(self, configs: Iterable[Config], root_namespace: str) -> None:
        self.root_namespace = root_namespace
        self._by_namespace: dict[str, list[Config]] = {}
        #: Mode of the mesh-wide policy (UNKNOWN without one; UNSET there means PERMISSIVE).
        self.mesh_mode = MtlsMode.UNKNOWN
        namespace_modes: dict[str, MtlsMode] = {}
        seen_wide: set[str] = set()
        for config in sorted(configs, key=istiod_order):
            if not _selector(config):
                if config.namespace in seen_wide:
                    continue  # istiod keeps only the oldest namespace-wide policy of a namespace
                seen_wide.add(config.namespace)
                mode = _spec_mode(config)
                if config.namespace == root_namespace:
                    self.mesh_mode = MtlsMode.PERMISSIVE if mode is MtlsMode.UNKNOWN else mode
                else:
                    namespace_modes[config.namespace] = mode
            self._by_namespace.setdefault(config.namespace, []).append(config)
        inherited = self.mesh_mode if self.mesh_mode is not MtlsMode.UNKNOWN else MtlsMode.PERMISSIVE
        self._namespace_modes = {
            ns: inherited if mode is MtlsMode.UNKNOWN else mode for ns, mode in namespace_modes.items()
        }
        #: Whether any policy or port sets DISABLE: only then can an endpoint's mode turn mTLS off.
        self.any_disable = any(
            _spec_mode(c) is MtlsMode.DISABLE
            or any(_mode(m) is MtlsMode.DISABLE for m in c.spec.port_level_mtls.values())
            for configs in self._by_namespace.values()
            for c in configs
        )
        #: Changes with any policy (what, where, when created): a cache key part for outputs that
        #: read workloads' modes.
        self.fingerprint = hash(
            tuple(
                (c.namespace, c.name, c.meta.creation_timestamp, c.spec.SerializeToString(deterministic=True))
                for configs in self._by_namespace.values()
                for c in configs
            )
        )
        self._memo: dict[tuple[str, frozenset[tuple[str, str]]], WorkloadMtls] = {}

    def __bool__(self) -> bool:
        return bool(self._by_namespace)

    def namespaces(self) -> frozenset[str]:
        return frozenset(self._by_namespace)

    def namespace_mode(self, namespace: str) -> MtlsMode:
        """istiod's GetNamespaceMutualTLSMode: the namespace-wide mode, else the mesh's (maybe UNKNOWN)."""
        return self._namespace_modes.get(namespace, self.mesh_mode)

    def service_mode(self, namespace: str) -> MtlsMode:
        """What clients assume of a service's servers (BestEffortInferServiceMTLSMode, without the
        passthrough check): the namespace or mesh mode, PERMISSIVE when neither sets one."""
        mode = self.namespace_mode(namespace)
        return MtlsMode.PERMISSIVE if mode is MtlsMode.UNKNOWN else mode

    def for_workload(self, namespace: str, labels: Mapping[str, str]) -> WorkloadMtls:
        """The effective mTLS of a workload (istiod's ComposePeerAuthentication)."""
        key = (namespace, frozenset(labels.items()))
        found = self._memo.get(key)
        if found is None:
            found = self._memo[key] = self._compose(namespace, labels)
        return found

    def _compose(self, namespace: str, labels: Mapping[str, str]) -> WorkloadMtls:
        mesh: Config | None = None
        wide: Config | None = None
        workload: Config | None = None
        for ns in dict.fromkeys((namespace, self.root_namespace)):
            for config in self._by_namespace.get(ns, ()):
                selector = _selector(config)
                if not selector:
                    if ns == self.root_namespace:
                        mesh = mesh or config
                    else:
                        wide = wide or config
                elif ns != self.root_namespace and workload is None and selector_matches(selector, labels):
                    workload = config  # configs are oldest first: the first match wins
        mode = MtlsMode.PERMISSIVE
        for chosen in (mesh, wide, workload):
            if chosen is not None and _spec_mode(chosen) is not MtlsMode.UNKNOWN:
                mode = _spec_mode(chosen)
        per_port: tuple[tuple[int, MtlsMode], ...] = ()
        if workload is not None:
            ports = workload.spec.port_level_mtls
            per_port = tuple(
                (port, _mode(ports[port]) if _mode(ports[port]) is not MtlsMode.UNKNOWN else mode)
                for port in sorted(ports)
            )
        return WorkloadMtls(mode, per_port)
