"""Gateway servers with ``tls.mode: AUTO_PASSTHROUGH`` (east-west gateways), as istiod builds them.

A client in another network reaches a service through such a gateway with the
mutual TLS it would use to the service's own sidecar: SNI
``outbound_.<port>_.<subset>_.<host>`` and one of Istio's mTLS ALPNs. The
gateway does not terminate that TLS; it reads the SNI and forwards the bytes.

- **Chains.** For each service the router sees that is not mesh-external,
  whose host lies within one of the server's hosts (their ``ns/`` part is
  ignored, as istiod ignores it here), and for each of its ports but UDP: a
  chain per cluster, the default one and one per DestinationRule subset,
  matching that SNI and any Istio mTLS ALPN, with a tcp_proxy to the SNI-DNAT
  cluster of the same name. The rule's TCP idle timeout, connection duration
  and source-IP hashing apply. No authorization filters: istiod builds these
  chains without them, the destination's sidecar enforces its policies.
- **Clusters.** A router with such a server also gets, for every visible
  service that is not mesh-external (whatever the server's hosts), the
  outbound clusters under their SNI names: the same cluster as
  ``outbound|...``, but without TLS of its own, since the client's passes
  through.
- **Endpoints.** SNI-DNAT clusters carry only the endpoints that take Istio
  mTLS (``endpoint.mtls_groups``): the gateway cannot tell whether the TLS it
  forwards is mTLS, so it may reach only workloads whose listener demands it.

Istio's east-west gateway chart still sets ``ISTIO_META_ROUTER_MODE=sni-dnat``;
istiod no longer reads it (the Gateway's TLS mode alone decides), and neither
does meshpilot. ``ISTIO_MUTUAL`` is the other way to serve mesh traffic at a
gateway: it terminates the client's mTLS with the gateway's own certificate
and routes by the ``tcp``/``http`` routes bound to it (``gateway_tls``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from envoy.config.listener.v3 import listener_components_pb2

from meshpilot.model.confighash import hash_value
from meshpilot.model.gateways import GatewayServer, MergedGateway
from meshpilot.model.hosts import host_subset_of
from meshpilot.model.proxy import Proxy
from meshpilot.networking import names
from meshpilot.networking.cluster import ClusterInputs, OutboundSpec, build_outbound_cluster, outbound_specs
from meshpilot.networking.filters import tcp_proxy
from meshpilot.networking.listener_inbound import ALL_ISTIO_ALPNS
from meshpilot.networking.tcp_routes import proxy_options

MODE = "AUTO_PASSTHROUGH"


def serves_auto_passthrough(gateway: MergedGateway) -> bool:
    """Whether any server of a router's Gateways is AUTO_PASSTHROUGH: then it gets SNI-DNAT clusters."""
    return any(server.tls_mode == MODE for server in gateway.servers)


def sni_dnat_specs(proxy: Proxy) -> list[OutboundSpec]:
    """The clusters that get an SNI-DNAT twin: every outbound one of an in-mesh service."""
    return [spec for spec in outbound_specs(proxy) if not spec.service.mesh_external]


def sni_dnat_name(spec: OutboundSpec) -> str:
    return names.sni_cluster(spec.port.port, spec.subset, spec.service.hostname)


def sni_dnat_cache_key(spec: OutboundSpec, inputs: ClusterInputs) -> int:
    """The outbound cluster's key, marked: the SNI-DNAT build reads the same inputs."""
    return hash_value(("sni-dnat", spec.cache_key(inputs)))


def sni_dnat_cluster(inputs: ClusterInputs, spec: OutboundSpec) -> Any | None:
    """The SNI-DNAT cluster of one outbound spec; None when it must not exist (DNS without endpoints)."""
    return build_outbound_cluster(inputs, spec.service, spec.port, spec.subset, spec.rule, sni_dnat=True)


def filter_chains(proxy: Proxy, server: GatewayServer, access_log: Sequence[Any] = ()) -> list[Any]:
    """A chain per SNI-DNAT cluster of the services within the server's hosts, in scope order;
    ``access_log`` are the tcp_proxy's loggers."""
    hosts = [h.host for h in server.hosts]
    out = []
    for spec in sni_dnat_specs(proxy):
        if not any(host_subset_of(spec.service.hostname, host) for host in hosts):
            continue
        cluster = sni_dnat_name(spec)
        match = listener_components_pb2.FilterChainMatch(
            server_names=[cluster], application_protocols=ALL_ISTIO_ALPNS
        )
        filters = [tcp_proxy(cluster, options=proxy_options(spec.rule, spec.subset), access_log=access_log)]
        out.append(listener_components_pb2.FilterChain(filter_chain_match=match, filters=filters))
    return out
