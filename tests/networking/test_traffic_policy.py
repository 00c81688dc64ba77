"""DestinationRule traffic policy on outbound clusters, field by field as istiod maps it."""

from __future__ import annotations

from typing import Any

import pytest
from envoy.config.cluster.v3 import cluster_pb2
from envoy.extensions.transport_sockets.proxy_protocol.v3 import upstream_proxy_protocol_pb2
from envoy.extensions.transport_sockets.tls.v3 import common_pb2, tls_pb2
from envoy.extensions.upstreams.http.v3 import http_protocol_options_pb2 as hpo
from google.protobuf import json_format
from support.kube import istio, workload
from support.model import build

from meshpilot._proto.istio.networking.v1alpha3 import destination_rule_pb2 as dr
from meshpilot.model.mesh import default_mesh_config
from meshpilot.networking.cluster import ClusterInputs, build_clusters
from meshpilot.networking.tls import TlsSettingsError, originated_upstream

CLIENT = "sidecar~10.1.0.11~client-0.default~default.svc.cluster.local"
HTTP = "outbound|8080||svc.default.svc.cluster.local"
TCP = "outbound|9000||svc.default.svc.cluster.local"
HPO = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"


def docs(policy: dict[str, Any] | None = None, subsets: list[dict[str, Any]] | None = None) -> list[Any]:
    out: list[Any] = [
        *workload("client", "default", "10.96.0.1", 80, {"client-0": "10.1.0.11"}),
        *workload("svc", "default", "10.96.0.2", 8080, {"svc-0": "10.1.0.21"}, labels={"version": "v1"}),
    ]
    # A second, TCP port on the same service.
    out[3]["spec"]["ports"].append({"name": "tcp", "port": 9000, "targetPort": 9000})
    spec: dict[str, Any] = {"host": "svc"}
    if policy is not None:
        spec["trafficPolicy"] = policy
    if subsets is not None:
        spec["subsets"] = subsets
    if policy is not None or subsets is not None:
        out.append(istio("DestinationRule", "svc", "default", spec))
    return out


def clusters(policy: dict[str, Any] | None = None, mesh: str | None = None, **kw: Any) -> dict[str, Any]:
    model = build(docs(policy, **kw), mesh)
    proxy = model.proxy(CLIENT)
    return {c.name: c for c in build_clusters(ClusterInputs(proxy, model.push, model.index))}


def options(cluster: Any) -> Any:
    out = hpo.HttpProtocolOptions()
    if HPO in cluster.typed_extension_protocol_options:
        cluster.typed_extension_protocol_options[HPO].Unpack(out)
    return out


def as_dict(message: Any) -> dict[str, Any]:
    return json_format.MessageToDict(message)


def test_workload_fixture_has_both_ports() -> None:
    assert {HTTP, TCP} <= set(clusters())


def test_simple_load_balancers() -> None:
    expected = {
        "ROUND_ROBIN": cluster_pb2.Cluster.ROUND_ROBIN,
        "LEAST_REQUEST": cluster_pb2.Cluster.LEAST_REQUEST,
        "LEAST_CONN": cluster_pb2.Cluster.LEAST_REQUEST,
        "RANDOM": cluster_pb2.Cluster.RANDOM,
    }
    for simple, policy in expected.items():
        assert clusters({"loadBalancer": {"simple": simple}})[HTTP].lb_policy == policy, simple
    assert clusters()[HTTP].lb_policy == cluster_pb2.Cluster.LEAST_REQUEST, "istiod's default"
    passthrough = clusters({"loadBalancer": {"simple": "PASSTHROUGH"}})[HTTP]
    assert passthrough.type == cluster_pb2.Cluster.ORIGINAL_DST
    assert passthrough.lb_policy == cluster_pb2.Cluster.CLUSTER_PROVIDED
    assert not passthrough.HasField("eds_cluster_config")


def test_consistent_hash_ring_and_maglev() -> None:
    ring = clusters(
        {"loadBalancer": {"consistentHash": {"httpHeaderName": "x", "ringHash": {"minimumRingSize": 64}}}}
    )
    assert ring[HTTP].lb_policy == cluster_pb2.Cluster.RING_HASH
    assert ring[HTTP].ring_hash_lb_config.minimum_ring_size.value == 64
    bare_ring = clusters({"loadBalancer": {"consistentHash": {"httpHeaderName": "x", "ringHash": {}}}})[HTTP]
    assert bare_ring.lb_policy == cluster_pb2.Cluster.RING_HASH
    assert not bare_ring.HasField("ring_hash_lb_config"), "no size given: Envoy's default"
    legacy = clusters({"loadBalancer": {"consistentHash": {"httpHeaderName": "x"}}})[HTTP]
    assert legacy.ring_hash_lb_config.minimum_ring_size.value == 1024
    legacy_sized = clusters(
        {"loadBalancer": {"consistentHash": {"httpHeaderName": "x", "minimumRingSize": 5}}}
    )
    assert legacy_sized[HTTP].ring_hash_lb_config.minimum_ring_size.value == 5
    maglev = clusters(
        {"loadBalancer": {"consistentHash": {"useSourceIp": True, "maglev": {"tableSize": 65537}}}}
    )
    assert maglev[HTTP].lb_policy == cluster_pb2.Cluster.MAGLEV
    assert maglev[HTTP].maglev_lb_config.table_size.value == 65537


def test_warmup_becomes_slow_start() -> None:
    legacy = clusters({"loadBalancer": {"simple": "ROUND_ROBIN", "warmupDurationSecs": "10s"}})[HTTP]
    assert as_dict(legacy.round_robin_lb_config) == {"slowStartConfig": {"slowStartWindow": "10s"}}
    warmup = clusters(
        {"loadBalancer": {"simple": "LEAST_REQUEST", "warmup": {"duration": "30s", "aggression": 2}}}
    )[HTTP]
    assert as_dict(warmup.least_request_lb_config) == {
        "slowStartConfig": {
            "slowStartWindow": "30s",
            "aggression": {"defaultValue": 2.0, "runtimeKey": "("},
            "minWeightPercent": {"value": 10.0},
        }
    }
    default = clusters({"loadBalancer": {"warmupDurationSecs": "5s"}})[HTTP]
    assert default.lb_policy == cluster_pb2.Cluster.LEAST_REQUEST
    assert default.least_request_lb_config.slow_start_config.slow_start_window.seconds == 5


def test_connection_pool() -> None:
    pool = {
        "tcp": {
            "maxConnections": 10,
            "connectTimeout": "3s",
            "maxConnectionDuration": "1h",
            "idleTimeout": "2m",
            "tcpKeepalive": {"probes": 3, "time": "60s", "interval": "10s"},
        },
        "http": {
            "http1MaxPendingRequests": 11,
            "http2MaxRequests": 12,
            "maxRequestsPerConnection": 13,
            "maxRetries": 14,
        },
    }
    c = clusters({"connectionPool": pool})[HTTP]
    [thresholds] = c.circuit_breakers.thresholds
    assert (
        thresholds.max_connections.value,
        thresholds.max_pending_requests.value,
        thresholds.max_requests.value,
        thresholds.max_retries.value,
        thresholds.track_remaining,
    ) == (10, 11, 12, 14, False)
    assert c.connect_timeout.seconds == 3
    assert as_dict(c.upstream_connection_options) == {
        "tcpKeepalive": {"keepaliveProbes": 3, "keepaliveTime": 60, "keepaliveInterval": 10}
    }
    common = options(c).common_http_protocol_options
    assert as_dict(common) == {
        "idleTimeout": "120s",
        "maxConnectionDuration": "3600s",
        "maxRequestsPerConnection": 13,
    }
    assert options(c).explicit_http_config.HasField("http_protocol_options"), (
        "Envoy needs a protocol: HTTP/1.1"
    )


def test_http_idle_timeout_wins_over_tcp_and_defaults_stay_unlimited() -> None:
    c = clusters({"connectionPool": {"tcp": {"idleTimeout": "2m"}, "http": {"idleTimeout": "5s"}}})[HTTP]
    assert options(c).common_http_protocol_options.idle_timeout.seconds == 5
    [thresholds] = clusters()[HTTP].circuit_breakers.thresholds
    assert thresholds.max_connections.value == thresholds.max_requests.value == 0xFFFFFFFF


def test_mesh_keepalive_with_rule_attributes_over_it() -> None:
    mesh = "tcpKeepalive: {probes: 9, time: 100s}\n"
    plain = clusters(mesh=mesh)[HTTP]
    assert as_dict(plain.upstream_connection_options) == {
        "tcpKeepalive": {"keepaliveProbes": 9, "keepaliveTime": 100}
    }
    c = clusters({"connectionPool": {"tcp": {"tcpKeepalive": {"time": "7s"}}}}, mesh=mesh)[HTTP]
    assert as_dict(c.upstream_connection_options) == {
        "tcpKeepalive": {"keepaliveProbes": 9, "keepaliveTime": 7}
    }


def test_h2_upgrade_and_client_protocol() -> None:
    upgraded = clusters(
        {"connectionPool": {"http": {"h2UpgradePolicy": "UPGRADE", "maxConcurrentStreams": 50}}}
    )
    explicit = options(upgraded[HTTP]).explicit_http_config
    assert explicit.http2_protocol_options.max_concurrent_streams.value == 50
    assert options(upgraded[TCP]).explicit_http_config.HasField("http2_protocol_options"), (
        "an explicit UPGRADE applies whatever the port says"
    )
    mesh_wide = clusters(mesh="h2UpgradePolicy: UPGRADE\n")
    assert options(mesh_wide[HTTP]).explicit_http_config.HasField("http2_protocol_options")
    assert HPO not in mesh_wide[TCP].typed_extension_protocol_options, "the mesh upgrades HTTP ports only"
    kept = clusters(
        {"connectionPool": {"http": {"h2UpgradePolicy": "DO_NOT_UPGRADE"}}}, mesh="h2UpgradePolicy: UPGRADE\n"
    )
    assert HPO not in kept[HTTP].typed_extension_protocol_options
    client = clusters({"connectionPool": {"http": {"useClientProtocol": True}}})
    downstream = options(client[HTTP]).use_downstream_protocol_config
    assert downstream.HasField("http_protocol_options") and downstream.HasField("http2_protocol_options")


def test_outlier_detection() -> None:
    outlier = {
        "consecutive5xxErrors": 5,
        "consecutiveGatewayErrors": 0,
        "interval": "10s",
        "baseEjectionTime": "30s",
        "maxEjectionPercent": 50,
        "minHealthPercent": 20,
        "splitExternalLocalOriginErrors": True,
        "consecutiveLocalOriginFailures": 4,
    }
    c = clusters({"outlierDetection": outlier})[HTTP]
    assert as_dict(c.outlier_detection) == {
        "consecutive5xx": 5,
        "enforcingConsecutive5xx": 100,
        "consecutiveGatewayFailure": 0,
        "enforcingConsecutiveGatewayFailure": 0,
        "interval": "10s",
        "baseEjectionTime": "30s",
        "maxEjectionPercent": 50,
        "enforcingSuccessRate": 0,
        "splitExternalLocalOriginErrors": True,
        "consecutiveLocalOriginFailure": 4,
        "enforcingConsecutiveLocalOriginFailure": 100,
        "enforcingLocalOriginSuccessRate": 0,
    }
    assert c.common_lb_config.healthy_panic_threshold.value == 20
    minimal = clusters({"outlierDetection": {"interval": "1s"}})[HTTP]
    assert as_dict(minimal.outlier_detection) == {"interval": "1s", "enforcingSuccessRate": 0}
    assert minimal.common_lb_config.HasField("healthy_panic_threshold"), "panic mode off (0%) by default"
    assert minimal.common_lb_config.healthy_panic_threshold.value == 0


def test_locality_weighted_config_only_when_weights_or_failover_are_in_play() -> None:
    weighted = "locality_weighted_lb_config"
    assert not clusters()[HTTP].common_lb_config.HasField(weighted)
    assert not clusters({"outlierDetection": {"interval": "1s"}})[HTTP].common_lb_config.HasField(weighted), (
        "default failover needs no locality weights"
    )
    distribute = {"localityLbSetting": {"distribute": [{"from": "r1/*", "to": {"r1/*": 100}}]}}
    assert clusters({"loadBalancer": distribute})[HTTP].common_lb_config.HasField(weighted)
    failover = {"localityLbSetting": {"failover": [{"from": "r1", "to": "r2"}]}}
    assert not clusters({"loadBalancer": failover})[HTTP].common_lb_config.HasField(weighted), (
        "failover without outlier detection does nothing"
    )
    with_outlier = {"loadBalancer": failover, "outlierDetection": {"interval": "1s"}}
    assert clusters(with_outlier)[HTTP].common_lb_config.HasField(weighted)
    mesh = "localityLbSetting: {failoverPriority: [topology.istio.io/network]}\n"
    assert clusters({"outlierDetection": {"interval": "1s"}}, mesh=mesh)[HTTP].common_lb_config.HasField(
        weighted
    )
    disabled = {
        "loadBalancer": {"localityLbSetting": {"enabled": False}},
        "outlierDetection": {"interval": "1s"},
    }
    assert not clusters(disabled, mesh=mesh)[HTTP].common_lb_config.HasField(weighted), (
        "the rule turns it off"
    )


def test_port_level_settings_replace_the_whole_policy() -> None:
    policy = {
        "loadBalancer": {"simple": "RANDOM"},
        "outlierDetection": {"interval": "1s"},
        "portLevelSettings": [{"port": {"number": 9000}, "connectionPool": {"tcp": {"maxConnections": 3}}}],
    }
    out = clusters(policy)
    assert out[HTTP].lb_policy == cluster_pb2.Cluster.RANDOM
    assert out[HTTP].HasField("outlier_detection")
    assert out[TCP].circuit_breakers.thresholds[0].max_connections.value == 3
    assert out[TCP].lb_policy == cluster_pb2.Cluster.LEAST_REQUEST, "not inherited from the rule"
    assert not out[TCP].HasField("outlier_detection"), "not inherited from the rule"


def test_subset_policy_merges_field_by_field_and_its_port_settings_replace() -> None:
    policy = {"loadBalancer": {"simple": "RANDOM"}, "connectionPool": {"tcp": {"maxConnections": 5}}}
    subsets = [
        {
            "name": "v1",
            "labels": {"version": "v1"},
            "trafficPolicy": {
                "loadBalancer": {"simple": "ROUND_ROBIN"},
                "portLevelSettings": [{"port": {"number": 9000}, "outlierDetection": {"interval": "2s"}}],
            },
        }
    ]
    out = clusters(policy, subsets=subsets)
    v1_http = out["outbound|8080|v1|svc.default.svc.cluster.local"]
    assert v1_http.lb_policy == cluster_pb2.Cluster.ROUND_ROBIN, "the subset's field wins"
    assert v1_http.circuit_breakers.thresholds[0].max_connections.value == 5, "the rule's other fields stay"
    v1_tcp = out["outbound|9000|v1|svc.default.svc.cluster.local"]
    assert v1_tcp.outlier_detection.interval.seconds == 2
    assert v1_tcp.lb_policy == cluster_pb2.Cluster.LEAST_REQUEST, "subset port settings replace everything"
    assert v1_tcp.circuit_breakers.thresholds[0].max_connections.value == 0xFFFFFFFF


def tls_context(cluster: Any) -> Any:
    out = tls_pb2.UpstreamTlsContext()
    cluster.transport_socket.typed_config.Unpack(out)
    return out


def test_tls_disable_turns_auto_mtls_off() -> None:
    c = clusters({"tls": {"mode": "DISABLE"}})[HTTP]
    assert not c.HasField("transport_socket") and not c.transport_socket_matches


def test_tls_istio_mutual_with_sni_and_sans() -> None:
    c = clusters(
        {"tls": {"mode": "ISTIO_MUTUAL", "sni": "custom", "subjectAltNames": ["spiffe://td/ns/x/sa/y"]}}
    )[HTTP]
    context = tls_context(c)
    assert context.sni == "custom"
    validation = context.common_tls_context.combined_validation_context
    assert [m.matcher.exact for m in validation.default_validation_context.match_typed_subject_alt_names] == [
        "spiffe://td/ns/x/sa/y"
    ]
    assert validation.validation_context_sds_secret_config.name == "ROOTCA"


def test_tls_simple_uses_the_rule_ca_or_the_system_roots() -> None:
    c = clusters(
        {"tls": {"mode": "SIMPLE", "caCertificates": "/etc/ca.pem", "subjectAltNames": ["api.example"]}}
    )
    context = tls_context(c[HTTP])
    common = context.common_tls_context
    assert context.sni == ""
    assert not common.tls_certificate_sds_secret_configs, "SIMPLE presents no client certificate"
    validation = common.combined_validation_context
    assert validation.validation_context_sds_secret_config.name == "file-root:/etc/ca.pem"
    assert [m.exact for m in validation.default_validation_context.match_subject_alt_names] == ["api.example"]
    params = common.tls_params
    assert (params.tls_minimum_protocol_version, params.tls_maximum_protocol_version) == (
        common_pb2.TlsParameters.TLSv1_2,
        common_pb2.TlsParameters.TLSv1_3,
    )
    upstream = options(c[HTTP]).upstream_http_protocol_options
    assert upstream.auto_sni and not upstream.auto_san_validation, "SANs given: no automatic SAN check"
    system = tls_context(clusters({"tls": {"mode": "SIMPLE", "sni": "api.example"}})[HTTP])
    assert system.sni == "api.example"
    assert (
        system.common_tls_context.combined_validation_context.validation_context_sds_secret_config.name
        == ("file-root:system")
    )
    skip = tls_context(clusters({"tls": {"mode": "SIMPLE", "insecureSkipVerify": True}})[HTTP])
    assert skip.common_tls_context.HasField("validation_context")
    assert not skip.common_tls_context.HasField("combined_validation_context")


def test_tls_mutual_needs_a_certificate_and_key() -> None:
    tls = {
        "mode": "MUTUAL",
        "clientCertificate": "/c.pem",
        "privateKey": "/k.pem",
        "caCertificates": "/ca.pem",
    }
    context = tls_context(clusters({"tls": tls})[HTTP])
    [secret] = context.common_tls_context.tls_certificate_sds_secret_configs
    assert secret.name == "file-cert:/c.pem~/k.pem"
    assert secret.sds_config.api_config_source.grpc_services[0].envoy_grpc.cluster_name == "sds-grpc"
    # Validation rejects such rules; the builder still refuses rather than send a broken context.
    incomplete = json_format.ParseDict(
        {"mode": "MUTUAL", "clientCertificate": "/c.pem"}, dr.ClientTLSSettings()
    )
    with pytest.raises(TlsSettingsError, match="client certificate and private key"):
        originated_upstream(incomplete, [], default_mesh_config(), http2=False, mutual=True)


def test_tls_origination_on_http2_advertises_h2() -> None:
    c = clusters({"tls": {"mode": "SIMPLE"}, "connectionPool": {"http": {"h2UpgradePolicy": "UPGRADE"}}})[
        HTTP
    ]
    assert list(tls_context(c).common_tls_context.alpn_protocols) == ["h2"]


def test_dns_cluster_inline_endpoints_get_locality_priorities() -> None:
    entry = istio(
        "ServiceEntry",
        "ext",
        "default",
        {
            "hosts": ["ext.example.com"],
            "location": "MESH_EXTERNAL",
            "resolution": "DNS",
            "ports": [{"number": 80, "name": "http", "protocol": "HTTP"}],
            "endpoints": [
                {"address": "near.example.com", "locality": "r1/z1"},
                {"address": "far.example.com", "locality": "r2/z1"},
            ],
        },
    )
    rule = istio(
        "DestinationRule",
        "ext",
        "default",
        {"host": "ext.example.com", "trafficPolicy": {"outlierDetection": {}}},
    )
    client = workload("client", "default", "10.96.0.1", 80, {"client-0": "10.1.0.11"})
    client[1]["metadata"]["labels"]["istio-locality"] = "r2.z1"
    model = build([*client, entry, rule])
    proxy = model.proxy(CLIENT)
    [cluster] = [
        c
        for c in build_clusters(ClusterInputs(proxy, model.push, model.index))
        if c.name == "outbound|80||ext.example.com"
    ]
    found = {
        e.endpoint.address.socket_address.address: g.priority
        for g in cluster.load_assignment.endpoints
        for e in g.lb_endpoints
    }
    assert found == {"far.example.com": 0, "near.example.com": 1}


def test_proxy_protocol_wraps_every_transport_socket() -> None:
    def unwrap(socket: Any) -> Any:
        assert socket.name == "envoy.transport_sockets.upstream_proxy_protocol"
        out = upstream_proxy_protocol_pb2.ProxyProtocolUpstreamTransport()
        socket.typed_config.Unpack(out)
        return out

    auto = clusters({"proxyProtocol": {"version": "V2"}})[HTTP]
    wrapped = [unwrap(m.transport_socket) for m in auto.transport_socket_matches]
    assert [w.config.version for w in wrapped] == [1, 1]
    assert [w.transport_socket.name for w in wrapped] == [
        "envoy.transport_sockets.tls",
        "envoy.transport_sockets.raw_buffer",
    ], "auto mTLS matches keep their sockets inside"
    plain = clusters({"proxyProtocol": {"version": "V1"}, "tls": {"mode": "DISABLE"}})[HTTP]
    inner = unwrap(plain.transport_socket)
    assert inner.config.version == 0 and inner.transport_socket.name == "envoy.transport_sockets.raw_buffer"
    port_level = {
        "proxyProtocol": {"version": "V1"},
        "portLevelSettings": [{"port": {"number": 8080}, "tls": {"mode": "DISABLE"}}],
    }
    assert not clusters(port_level)[HTTP].HasField("transport_socket"), (
        "a port-level setting drops proxyProtocol"
    )
