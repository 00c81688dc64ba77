"""MeshConfig: istiod's defaults, and user YAML applied over them."""

from __future__ import annotations

import pytest

from meshpilot.config.errors import ConfigError
from meshpilot.model.mesh import ALLOW_ANY, REGISTRY_ONLY, apply_mesh_config, default_mesh_config


def test_defaults_are_istiods() -> None:
    mc = default_mesh_config()
    assert mc.outbound_traffic_policy.mode == ALLOW_ANY
    assert mc.connect_timeout.seconds == 10
    assert mc.enable_auto_mtls.value is True
    assert mc.trust_domain == "cluster.local"
    assert mc.root_namespace == "istio-system"
    assert (mc.proxy_listen_port, mc.proxy_inbound_listen_port) == (15001, 15006)
    assert mc.default_config.discovery_address == "istiod.istio-system.svc:15012"
    assert [p.name for p in mc.extension_providers] == ["prometheus", "stackdriver", "envoy"]


def test_fields_override_proxy_config_merges_providers_merge_by_name() -> None:
    mc = apply_mesh_config(
        """
        outboundTrafficPolicy: {mode: REGISTRY_ONLY}
        connectTimeout: 2s
        defaultConfig: {proxyStatsMatcher: {inclusionPrefixes: [cluster]}}
        trustDomainAliases: [old.local]
        extensionProviders:
        - {name: envoy, envoyFileAccessLog: {path: /dev/stderr}}
        - {name: zipkin, zipkin: {service: zipkin.istio-system, port: 9411}}
        """
    )
    assert mc.outbound_traffic_policy.mode == REGISTRY_ONLY
    assert mc.connect_timeout.seconds == 2
    assert list(mc.default_config.proxy_stats_matcher.inclusion_prefixes) == ["cluster"]
    assert mc.default_config.discovery_address == "istiod.istio-system.svc:15012", "proxy config merged"
    assert list(mc.trust_domain_aliases) == ["old.local"]
    providers = {p.name: p for p in mc.extension_providers}
    assert list(providers) == ["prometheus", "stackdriver", "envoy", "zipkin"]
    assert providers["envoy"].envoy_file_access_log.path == "/dev/stderr"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("notAField: 1", "unknown field 'notAField'"),
        ("connectTimeout: forever", "invalid duration"),
        ("- a list", "must be a YAML object"),
        ("a: [", "invalid YAML"),
    ],
)
def test_bad_mesh_config(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        apply_mesh_config(text)
