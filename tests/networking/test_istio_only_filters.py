"""Which proxy gets Istio-only filters (networking/extensions.py), shown with the node metadata a real
pilot-agent sent (tests/reference/agent_node_metadata.json) and the extension names each proxy build
reports; and the rule that an inbound chain offering ``istio-peer-exchange`` starts with the filter
that strips the exchange."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import any_pb2, json_format
from support.kube import workload
from support.model import Model, build

from meshpilot.model.proxy import NodeMetadata, Proxy, parse_proxy
from meshpilot.model.push_request import PushRequest
from meshpilot.networking import extensions
from meshpilot.networking.extensions import IstioFilter
from meshpilot.xds.connection import WatchedResource
from meshpilot.xds.generators import GenerationContext, sidecar_generators
from meshpilot.xds.types import TypeUrl

RECORDED = json.loads((Path(__file__).parents[1] / "reference" / "agent_node_metadata.json").read_text())
NODE_ID = "sidecar~10.1.0.10~productpage-v1-6c9f8df8d-x7k2p.default~default.svc.cluster.local"
#: Run-specific values the recording left as placeholders.
FILLED = {"ISTIO_VERSION": "1.28.0", "INSTANCE_IPS": "10.1.0.10"}
#: The recording ran without capture; a captured pod's agent sends REDIRECT (inbound listeners then).
CAPTURED = {"INTERCEPTION_MODE": "REDIRECT"}

#: What Istio's proxy reports in node.extensions for its own filters (istio/proxy's factory names).
ISTIO_PROXY_NAMES = frozenset(f.value for f in IstioFilter)
#: A few of the names upstream Envoy reports: none of Istio's.
UPSTREAM_ENVOY_NAMES = frozenset(
    {
        "envoy.filters.network.http_connection_manager",
        "envoy.filters.network.tcp_proxy",
        "envoy.filters.http.router",
        "envoy.filters.http.cors",
        "envoy.filters.http.fault",
        "envoy.transport_sockets.tls",
    }
)
ISTIO_ONLY = ("istio.stats", "istio.metadata_exchange", "istio.alpn")
MESH = "defaultProviders: {metrics: [prometheus]}"


def _agent_metadata() -> dict[str, Any]:
    out = {}
    for key, value in RECORDED.items():
        if isinstance(value, str) and value.startswith("<"):
            value = FILLED.get(key, "15020")
        out[key] = value
    return {**out, **CAPTURED}


def _model() -> Model:
    docs = [
        *workload(
            "productpage", "default", "10.96.0.10", 9080, {"productpage-v1-6c9f8df8d-x7k2p": "10.1.0.10"}
        ),
        *workload("db", "default", "10.96.0.20", 5432, {"db-1": "10.1.0.20"}, port_name="tcp-db"),
    ]
    return build(docs, MESH)


def _proxy(model: Model, metadata: dict[str, Any], reported: frozenset[str]) -> Proxy:
    proxy = parse_proxy(NODE_ID, NodeMetadata.parse(metadata), extensions=reported)
    model.env.refresh_proxy(proxy, model.push)
    return proxy


def _generate(model: Model, proxy: Proxy) -> dict[str, list[dict[str, Any]]]:
    request = PushRequest(full=True, forced=True, reasons=Counter(), push=model.push)
    ctx = GenerationContext(proxy, model.push, model.index, request)
    generators = sidecar_generators()
    out = {}
    for type_url in (TypeUrl.CLUSTER, TypeUrl.LISTENER):
        watch = WatchedResource(type_url.value, frozenset(), wildcard=True)
        resources = generators[type_url].generate(ctx, watch, None) or []
        out[type_url.name] = [
            json_format.MessageToDict(any_pb2.Any.FromString(r.payload), preserving_proto_field_name=True)
            for r in resources
        ]
    return out


def _offered_alpns(node: Any) -> set[str]:
    """Every ALPN a TLS context offers (not the chain matches, which only read the client's offer)."""
    found: set[str] = set()
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "alpn_protocols":
                found.update(value)
            else:
                found |= _offered_alpns(value)
    elif isinstance(node, list):
        for item in node:
            found |= _offered_alpns(item)
    return found


def test_the_real_agent_metadata_marks_an_istio_proxy() -> None:
    model = _model()
    proxy = _proxy(model, _agent_metadata(), frozenset())
    assert extensions.is_istio_proxy(proxy)
    assert all(extensions.supports(proxy, f) for f in IstioFilter)


@pytest.mark.parametrize(
    ("reported", "istio_version", "expected"),
    [
        # istiod's behaviour: an Istio proxy that lists nothing gets everything.
        (frozenset(), True, True),
        # Istio's proxy lists its filters under these names.
        (ISTIO_PROXY_NAMES | UPSTREAM_ENVOY_NAMES, True, True),
        # Upstream Envoy lists its own extensions, none of Istio's: nothing Istio-only, whatever the metadata.
        (UPSTREAM_ENVOY_NAMES, True, False),
        # The names istiod gives the filters in the config are not what a proxy reports.
        (frozenset({"istio.metadata_exchange", "istio.stats"}) | UPSTREAM_ENVOY_NAMES, True, False),
        # Not started by Istio's agent and listing nothing: nothing Istio-only.
        (frozenset(), False, False),
    ],
)
def test_istio_only_filters_go_where_the_rule_says(
    reported: frozenset[str], istio_version: bool, expected: bool
) -> None:
    metadata = _agent_metadata()
    if not istio_version:
        del metadata["ISTIO_VERSION"]
    model = _model()
    out = _generate(model, _proxy(model, metadata, reported))
    text = json.dumps(out)
    for name in ISTIO_ONLY:
        assert (name in text) is expected, name
    assert ("istio-peer-exchange" in _offered_alpns(out)) is expected


def test_only_some_reported_filters_are_sent_alone() -> None:
    """A proxy listing the HTTP peer_metadata filter but not the TCP exchange ones gets the first only:
    in particular no inbound chain offers the exchange ALPN without the filter that strips it."""
    model = _model()
    proxy = _proxy(model, _agent_metadata(), UPSTREAM_ENVOY_NAMES | {IstioFilter.PEER_METADATA.value})
    out = _generate(model, proxy)
    text = json.dumps(out)
    assert "io.istio.http.peer_metadata.Config" in text
    assert "istio-peer-exchange" not in _offered_alpns(out)
    assert "envoy.tcp.metadataexchange.config.MetadataExchange" not in text


def _chains(listener: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        *listener.get("filter_chains", []),
        *([listener["default_filter_chain"]] if "default_filter_chain" in listener else []),
    ]


@pytest.mark.parametrize(
    "reported",
    [
        frozenset(),
        ISTIO_PROXY_NAMES | UPSTREAM_ENVOY_NAMES,
        UPSTREAM_ENVOY_NAMES | {IstioFilter.TCP_METADATA_EXCHANGE.value},
    ],
)
def test_a_chain_offering_the_exchange_alpn_starts_with_the_exchange_filter(reported: frozenset[str]) -> None:
    model = _model()
    out = _generate(model, _proxy(model, _agent_metadata(), reported))
    offering = 0
    for listener in out["LISTENER"]:
        for chain in _chains(listener):
            alpn = json.dumps(chain.get("transport_socket", {}))
            if "istio-peer-exchange" in alpn:
                offering += 1
                assert chain["filters"][0]["name"] == "istio.metadata_exchange", chain.get("name")
    assert offering > 0
    # Clients offer the exchange only from clusters that carry the upstream filter.
    for cluster in out["CLUSTER"]:
        offers = "istio-peer-exchange" in json.dumps(cluster.get("transport_socket_matches", []))
        has_filter = any(f["name"] == "istio.metadata_exchange" for f in cluster.get("filters", []))
        assert offers <= has_filter, cluster["name"]


def test_istio_and_plain_proxies_of_one_scope_do_not_share_cached_listeners() -> None:
    """Both list no extensions; only the agent's metadata tells them apart, so it is in the cache keys."""
    model = _model()
    metadata = _agent_metadata()
    plain = {k: v for k, v in metadata.items() if k != "ISTIO_VERSION"}
    istio_out = json.dumps(_generate(model, _proxy(model, metadata, frozenset())))
    plain_out = json.dumps(_generate(model, _proxy(model, plain, frozenset())))
    assert "istio.stats" in istio_out
    assert "istio.stats" not in plain_out


def test_inbound_tcp_chains_get_stats_and_exchange_in_istiods_order() -> None:
    model = _model()
    out = _generate(model, _proxy(model, _agent_metadata(), frozenset()))
    [inbound] = [li for li in out["LISTENER"] if li["name"] == "virtualInbound"]
    tcp_chains = [
        c for c in inbound["filter_chains"] if c["filters"][-1]["name"] == "envoy.filters.network.tcp_proxy"
    ]
    assert tcp_chains
    for chain in tcp_chains:
        names = [f["name"] for f in chain["filters"]]
        assert names[0] == "istio.metadata_exchange"
        assert names[-2:] == ["istio.stats", "envoy.filters.network.tcp_proxy"]
