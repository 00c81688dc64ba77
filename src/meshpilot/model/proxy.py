"""Proxies: identity parsed from the node ID and metadata, plus per-push state."""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from meshpilot.bounded_logs import clip
from meshpilot.input_limits import MAX_METADATA_JSON_CHARS, MAX_NODE_ID_CHARS, InputRejected, load_json
from meshpilot.model.endpoint import Locality
from meshpilot.model.identity import IdentityEnum, same_objects

if TYPE_CHECKING:
    from meshpilot.model.service import ServiceTarget
    from meshpilot.model.sidecar_scope import SidecarScope

T = TypeVar("T")


class NodeType(IdentityEnum):
    SIDECAR = "sidecar"
    ROUTER = "router"
    WAYPOINT = "waypoint"
    ZTUNNEL = "ztunnel"


class InterceptionMode(IdentityEnum):
    REDIRECT = "REDIRECT"
    TPROXY = "TPROXY"
    NONE = "NONE"


class InvalidNode(ValueError):
    """The node ID or metadata cannot identify a proxy (gRPC INVALID_ARGUMENT)."""


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


@dataclass(frozen=True, slots=True)
class NodeMetadata:
    """The node metadata fields meshpilot reads (keys as pilot-agent sends them)."""

    namespace: str = ""
    cluster_id: str = ""
    istio_version: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    instance_ips: tuple[str, ...] = ()
    node_name: str = ""
    workload_name: str = ""
    service_account: str = ""
    interception_mode: InterceptionMode = InterceptionMode.REDIRECT
    network: str = ""
    mesh_id: str = ""
    generator: str = ""
    #: Container ports of the proxy's pod, from ``POD_PORTS`` (JSON).
    pod_ports: tuple[dict[str, Any], ...] = ()
    unprivileged_pod: bool = False
    #: Everything that was sent, for the debug endpoints.
    raw: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def parse(cls, raw: dict[str, Any]) -> NodeMetadata:
        """Parse metadata as sent in ``node.metadata``; unknown keys are kept in ``raw``."""

        def text(key: str) -> str:
            value = raw.get(key, "")
            if not isinstance(value, str):
                raise InvalidNode(f"node metadata {key} must be a string, got {type(value).__name__}")
            return value

        labels = raw.get("LABELS") or {}
        if not isinstance(labels, dict) or not all(isinstance(v, str) for v in labels.values()):
            raise InvalidNode("node metadata LABELS must be a map of strings")
        mode_text = text("INTERCEPTION_MODE") or "REDIRECT"
        try:
            mode = InterceptionMode(mode_text)
        except ValueError:
            raise InvalidNode(
                f"node metadata INTERCEPTION_MODE '{clip(mode_text)}' is not one of REDIRECT, TPROXY, NONE"
            ) from None
        ips = tuple(ip.strip() for ip in text("INSTANCE_IPS").split(",") if ip.strip())
        pod_ports: tuple[dict[str, Any], ...] = ()
        if text("POD_PORTS"):
            try:
                parsed = load_json(text("POD_PORTS"), "node metadata POD_PORTS", MAX_METADATA_JSON_CHARS)
            except InputRejected as err:
                raise InvalidNode(str(err)) from None
            if isinstance(parsed, list):
                pod_ports = tuple(p for p in parsed if isinstance(p, dict))
        return cls(
            namespace=text("NAMESPACE"),
            cluster_id=text("CLUSTER_ID"),
            istio_version=text("ISTIO_VERSION"),
            labels=dict(labels),
            instance_ips=ips,
            node_name=text("NODE_NAME"),
            workload_name=text("WORKLOAD_NAME"),
            service_account=text("SERVICE_ACCOUNT"),
            interception_mode=mode,
            network=text("NETWORK"),
            mesh_id=text("MESH_ID"),
            generator=text("GENERATOR"),
            pod_ports=pod_ports,
            unprivileged_pod=text("UNPRIVILEGED_POD").lower() == "true",
            raw=raw,
        )


@dataclass(frozen=True, slots=True)
class ProxyState:
    """What a proxy's config depends on besides its identity, recomputed on every full push (istiod's
    ``computeProxyState``: ``push.environment.refresh_proxy``). Replaced whole, never edited, and one
    proxy's only: ``derived`` keeps answers that read the proxy's identity too."""

    #: The workload's labels (its Pod's, else the node's metadata), with the topology labels.
    labels: Mapping[str, str] = field(default_factory=dict)
    locality: Locality = field(default_factory=Locality)
    #: Service ports the proxy's own workload serves (inbound listeners and clusters).
    service_targets: tuple[ServiceTarget, ...] = ()
    sidecar_scope: SidecarScope | None = None
    #: The scope before the last recomputation; a change concerns the proxy if it
    #: concerns either scope (a host may have just left or entered it).
    previous_scope: SidecarScope | None = None
    #: Whether the last recomputation read the workload again (its Pod, Node or services were other
    #: objects), so labels, locality and service targets may differ from the state before. Only
    #: meaningful beside ``previous_scope``, and dropped with it.
    workload_reread: bool = False
    #: The registry objects ``labels``, ``locality`` and ``service_targets`` were read from
    #: (``workload_inputs``: the registries asked, with the Pod, Node and services found); None until
    #: the first refresh. The next refresh reuses all three while these are the same objects.
    workload_inputs: tuple[object, ...] | None = field(default=None, compare=False, repr=False)
    #: ``inbound_signature``, worked out on first use (init=False: a copy made by
    #: ``dataclasses.replace`` works it out again from its own targets).
    _signature: tuple[object, ...] | None = field(default=None, init=False, compare=False, repr=False)
    #: ``derived``'s answers and the snapshot they were asked with (init=False, as ``_signature``).
    _derived: dict[str, object] | None = field(default=None, init=False, compare=False, repr=False)
    _derived_for: object = field(default=None, init=False, compare=False, repr=False)

    @property
    def inbound_signature(self) -> tuple[object, ...]:
        """What decides the proxy's inbound config besides capabilities and scope: the ports it
        serves. CDS and LDS both key a full push's inbound part by it: worked out once per state."""
        found = self._signature
        if found is None:
            found = tuple(
                (
                    t.target_port,
                    t.port.port,
                    t.port.name,
                    t.port.protocol.value,
                    t.service.hostname,
                    t.service.namespace,
                    t.service.name,
                )
                for t in self.service_targets
            )
            object.__setattr__(self, "_signature", found)
        return found

    def derived(self, snapshot: object, purpose: str, make: Callable[[], T]) -> T:
        """``make()`` once per state, snapshot and ``purpose``: for answers that read only this state,
        the proxy's identity and the snapshot, which one proxy asks several times per push (the
        Telemetry objects that apply to it are asked for by every filter that reads telemetry).
        Asked with another snapshot (a request answered before the proxy's refresh), it starts over:
        it holds the answers of one snapshot only."""
        found = self._derived
        if found is None or self._derived_for is not snapshot:
            found = {}
            object.__setattr__(self, "_derived", found)
            object.__setattr__(self, "_derived_for", snapshot)
        try:
            return found[purpose]  # type: ignore[return-value]
        except KeyError:
            value = found[purpose] = make()
            return value

    def settled(self) -> ProxyState:
        """This state without its previous scope (a push that read it is done with it).

        Built directly: ``dataclasses.replace`` costs several times more, once per proxy per push."""
        settled = ProxyState(
            labels=self.labels,
            locality=self.locality,
            service_targets=self.service_targets,
            sidecar_scope=self.sidecar_scope,
            workload_inputs=self.workload_inputs,
        )
        # The same targets: the signature worked out for them holds (it is asked after this).
        object.__setattr__(settled, "_signature", self._signature)
        return settled

    def with_signature_of(self, other: ProxyState) -> ProxyState:
        """This state, given ``other``'s ``inbound_signature`` if both have the same service targets
        (the same objects: a refresh keeps its targets, or finds them again, and each full push would
        otherwise work the signature out anew for every proxy). Returns itself."""
        if other._signature is not None and (
            other.service_targets is self.service_targets
            or same_objects(other.service_targets, self.service_targets)
        ):
            object.__setattr__(self, "_signature", other._signature)
        return self


@dataclass(slots=True)
class Proxy:
    """A connected proxy: an identity fixed when its stream opened, and ``state``, which each full
    push replaces. Assigning any other field after construction raises."""

    type: NodeType
    ip_addresses: tuple[str, ...]
    #: ``POD.NAMESPACE`` for Kubernetes workloads.
    id: str
    dns_domain: str
    metadata: NodeMetadata
    config_namespace: str
    cluster_id: str
    #: Envoy extension names the proxy reported (``node.extensions``).
    extensions: frozenset[str] = frozenset()
    #: The locality Envoy reported in its node (``region/zone/subzone``); the registry's wins.
    node_locality: str = ""
    #: Envoy's ``node.cluster`` (the agent's service cluster): tracers name the spans' service by it.
    node_cluster: str = ""
    state: ProxyState = field(default_factory=ProxyState)
    #: Derived from the identity fields once: generators ask for them per resource.
    ipv6_only: bool = field(init=False)
    capabilities: tuple[frozenset[str], bool, bool, InterceptionMode, bool] = field(init=False)

    def __post_init__(self) -> None:
        self.ipv6_only = all(":" in ip for ip in self.ip_addresses)
        # What, besides its scope, decides a proxy's outbound config: extensions (and, when it lists
        # none, whether Istio's agent started it: networking/extensions.py), IP family, capture.
        self.capabilities = (
            self.extensions,
            bool(self.metadata.istio_version),
            self.ipv6_only,
            self.interception_mode,
            self.metadata.unprivileged_pod,
        )

    def __setattr__(self, name: str, value: object) -> None:
        if name != "state":
            try:
                object.__getattribute__(self, name)
            except AttributeError:  # being constructed
                pass
            else:
                raise AttributeError(f"a proxy's {name} is part of its identity and does not change")
        object.__setattr__(self, name, value)

    @property
    def labels(self) -> Mapping[str, str]:
        return self.state.labels

    @property
    def locality(self) -> Locality:
        return self.state.locality

    @property
    def service_targets(self) -> tuple[ServiceTarget, ...]:
        return self.state.service_targets

    @property
    def sidecar_scope(self) -> SidecarScope | None:
        return self.state.sidecar_scope

    @property
    def previous_scope(self) -> SidecarScope | None:
        return self.state.previous_scope

    @property
    def ip(self) -> str:
        return self.ip_addresses[0]

    @property
    def inbound_signature(self) -> tuple[object, ...]:
        """The ports the proxy serves, as its inbound config is keyed (``ProxyState``)."""
        return self.state.inbound_signature

    @property
    def interception_mode(self) -> InterceptionMode:
        return self.metadata.interception_mode

    @property
    def pod_key(self) -> tuple[str, str] | None:
        """(namespace, name) of the proxy's own Pod, when the ID names one."""
        parts = self.id.split(".")
        if len(parts) == 2 and parts[0] and parts[1] == self.config_namespace:
            return parts[1], parts[0]
        return None

    @property
    def is_proxyless_grpc(self) -> bool:
        return self.metadata.generator == "grpc"

    def has_extension(self, name: str) -> bool:
        return name in self.extensions


def locality_label(region: str, zone: str, subzone: str) -> str:
    """``region/zone/subzone`` without trailing empty parts, as endpoint localities are written."""
    return "/".join((region, zone, subzone)).rstrip("/")


def parse_proxy(
    node_id: str,
    metadata: NodeMetadata,
    *,
    default_cluster_id: str = "Kubernetes",
    extensions: frozenset[str] = frozenset(),
    locality: str = "",
    node_cluster: str = "",
) -> Proxy:
    """Parse ``TYPE~IP~ID~DOMAIN`` as istiod does; raises InvalidNode."""
    if len(node_id) > MAX_NODE_ID_CHARS:
        raise InvalidNode(f"node id of {len(node_id)} characters, at most {MAX_NODE_ID_CHARS}")
    parts = node_id.split("~")
    if len(parts) != 4:
        raise InvalidNode(f"missing parts in the service node '{clip(node_id)}'")
    try:
        node_type = NodeType(parts[0])
    except ValueError:
        valid = ", ".join(t.value for t in NodeType)
        raise InvalidNode(
            f"invalid node type (valid types: {valid}) in the service node '{clip(node_id)}'"
        ) from None
    if metadata.instance_ips and all(_is_ip(ip) for ip in metadata.instance_ips):
        ips = metadata.instance_ips
    elif _is_ip(parts[1]):
        ips = (parts[1],)
    else:
        raise InvalidNode("no valid IP address in the service node id or metadata")
    dns_domain = parts[3]
    namespace = metadata.namespace
    if not namespace:
        labels = dns_domain.split(".")
        namespace = labels[0] if len(labels) > 1 else ""
    return Proxy(
        type=node_type,
        ip_addresses=ips,
        id=parts[2],
        dns_domain=dns_domain,
        metadata=metadata,
        config_namespace=namespace,
        cluster_id=metadata.cluster_id or default_cluster_id,
        extensions=extensions,
        state=ProxyState(labels=dict(metadata.labels)),
        node_locality=locality,
        node_cluster=node_cluster,
    )
