"""Names of Envoy resources, exactly as istiod names them."""

from __future__ import annotations

BLACKHOLE_CLUSTER = "BlackHoleCluster"
PASSTHROUGH_CLUSTER = "PassthroughCluster"
INBOUND_PASSTHROUGH_CLUSTER = "InboundPassthroughCluster"

VIRTUAL_OUTBOUND = "virtualOutbound"
VIRTUAL_INBOUND = "virtualInbound"
VIRTUAL_OUTBOUND_BLACKHOLE = "virtualOutbound-blackhole"
VIRTUAL_OUTBOUND_CATCHALL_TCP = "virtualOutbound-catchall-tcp"
VIRTUAL_INBOUND_BLACKHOLE = "virtualInbound-blackhole"
VIRTUAL_INBOUND_CATCHALL_HTTP = "virtualInbound-catchall-http"
PASSTHROUGH_FILTER_CHAIN = "PassthroughFilterChain"

ALLOW_ANY_VHOST = "allow_any"
BLOCK_ALL_VHOST = "block_all"

#: Source address of inbound traffic the sidecar forwards to the app, so the
#: capture rules can tell it apart from the app's own traffic.
INBOUND_PASSTHROUGH_BIND_IPV4 = "127.0.0.6"
INBOUND_PASSTHROUGH_BIND_IPV6 = "::6"

#: SDS secret names served by the proxy's agent over the bootstrap cluster ``sds-grpc``.
SDS_DEFAULT = "default"
SDS_ROOTCA = "ROOTCA"
SDS_CLUSTER = "sds-grpc"


def outbound_cluster(port: int, subset: str, host: str) -> str:
    """``outbound|9080|v1|reviews.default.svc.cluster.local``."""
    return f"outbound|{port}|{subset}|{host}"


def inbound_cluster(port: int) -> str:
    return f"inbound|{port}||"


def sni_cluster(port: int, subset: str, host: str) -> str:
    """``outbound_.9080_.v1_.reviews...``: the SNI of in-mesh mTLS, and the name of the SNI-DNAT
    cluster an AUTO_PASSTHROUGH gateway forwards that SNI to."""
    return f"outbound_.{port}_.{subset}_.{host}"


_SNI_PREFIXES = ("outbound_.", "inbound_.")


def is_sni_cluster(name: str) -> bool:
    """Whether ``name`` is in the ``outbound_.PORT_.SUBSET_.HOST`` form (istiod's DNS SRV key)."""
    return name.startswith(_SNI_PREFIXES)


def parse_cluster(name: str) -> tuple[str, int, str, str] | None:
    """(direction, port, subset, host) of an ``outbound|...`` or ``inbound|...`` name, or of its SNI
    form ``outbound_.PORT_.SUBSET_.HOST``, as istiod's ParseSubsetKey reads both."""
    if is_sni_cluster(name):
        # As istiod: a host holding "_." is not read as one (it finds no service either way).
        parts = name.split("_.")
        if len(parts) != 4:
            return None
    else:
        parts = name.split("|")
        if len(parts) != 4:
            return None
    if parts[0] not in ("outbound", "inbound"):
        return None
    try:
        port = int(parts[1])
    except ValueError:
        return None
    return parts[0], port, parts[2], parts[3]


def listener_name(bind: str, port: int) -> str:
    """``0.0.0.0_9080``, ``10.96.0.1_3306``, ``127.0.0.1_9080``."""
    return f"{bind}_{port}"


def stat_name(name: str) -> str:
    """istiod's alt_stat_name / stat prefix form: the name and a ';'."""
    return f"{name};"
