"""xDS type URLs, in one place, and the order pushes send them in."""

from __future__ import annotations

import enum


class TypeUrl(enum.StrEnum):
    CLUSTER = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
    ENDPOINT = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"
    LISTENER = "type.googleapis.com/envoy.config.listener.v3.Listener"
    ROUTE = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration"
    SECRET = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret"
    NAME_TABLE = "type.googleapis.com/istio.networking.nds.v1.NameTable"
    PROXY_CONFIG = "type.googleapis.com/istio.mesh.v1alpha1.ProxyConfig"
    HEALTH = "type.googleapis.com/istio.v1.HealthInformation"
    #: istioctl's types: the debug pages by name (``x internal-debug``), sync status, one proxy's config.
    DEBUG = "istio.io/debug"
    DEBUG_SYNCZ = "istio.io/debug/syncz"
    DEBUG_CONFIG_DUMP = "istio.io/debug/config_dump"

    #: The short name used in metrics labels and debug output (cds, eds, ...; the URL itself for
    #: types without one). An attribute of each member, set below: read for every proxy of a push.
    short: str

    @property
    def is_debug(self) -> bool:
        """Debug types are answered once per request: no watch is kept and pushes never send them."""
        return self in _DEBUG

    @property
    def is_wildcard(self) -> bool:
        """Wildcard types are requested whole; empty names never unsubscribe them."""
        return self not in _NON_WILDCARD


_SHORT = {
    TypeUrl.CLUSTER: "cds",
    TypeUrl.ENDPOINT: "eds",
    TypeUrl.LISTENER: "lds",
    TypeUrl.ROUTE: "rds",
    TypeUrl.SECRET: "sds",
    TypeUrl.NAME_TABLE: "nds",
    TypeUrl.PROXY_CONFIG: "pcds",
}
for _member in TypeUrl:
    _member.short = _SHORT.get(_member, _member.value)
del _member
_DEBUG = frozenset({TypeUrl.DEBUG, TypeUrl.DEBUG_SYNCZ, TypeUrl.DEBUG_CONFIG_DUMP})
_NON_WILDCARD = frozenset({TypeUrl.ENDPOINT, TypeUrl.ROUTE, TypeUrl.SECRET})

#: Within one push, types go out in this order (make-before-break for Envoy).
PUSH_ORDER = (TypeUrl.CLUSTER, TypeUrl.ENDPOINT, TypeUrl.LISTENER, TypeUrl.ROUTE, TypeUrl.SECRET)


_BY_VALUE: dict[str, TypeUrl] = {t.value: t for t in TypeUrl}


def parse_type_url(text: str) -> TypeUrl | None:
    # A dict lookup: this runs for every request and every push of every stream.
    return _BY_VALUE.get(text)


def is_wildcard_type(type_url: str) -> bool:
    known = parse_type_url(type_url)
    return known.is_wildcard if known is not None else True
