"""The legacy ProxyConfig ``tracing`` section in the agent's bootstrap, built in-process.

``test_agent_bootstrap.py::test_bootstrap_matches_pilot_agent`` compares these shapes with what Istio's
pilot-agent writes; here each tracer's pieces are checked one by one, with the inputs that refuse.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import prometheus_client
import pytest

from meshpilot.agent.bootstrap import build_bootstrap
from meshpilot.agent.settings import Flags, SettingsError, load_settings

ENV = {
    "POD_NAME": "web-1",
    "POD_NAMESPACE": "shop",
    "INSTANCE_IP": "10.1.2.3",
    "HOST_IP": "192.168.7.9",
    "SERVICE_ACCOUNT": "web",
}


def _root(tmp_path: Path, labels: str = 'app="web"\n') -> Path:
    podinfo = tmp_path / "etc/istio/pod"
    podinfo.mkdir(parents=True)
    (podinfo / "labels").write_text(labels)
    (podinfo / "annotations").write_text("")
    return tmp_path


def _bootstrap(tmp_path: Path, tracing: dict[str, Any], **env: str) -> dict[str, Any]:
    proxy_config = json.dumps({"tracing": tracing})
    return build_bootstrap(
        load_settings(Flags(), {**ENV, "PROXY_CONFIG": proxy_config, **env}, _root(tmp_path))
    )


def _cluster(bootstrap: dict[str, Any], name: str) -> dict[str, Any]:
    [cluster] = [c for c in bootstrap["static_resources"]["clusters"] if c["name"] == name]
    return dict(cluster)


def _unapplied(field: str) -> float | None:
    return prometheus_client.REGISTRY.get_sample_value(
        "meshpilot_agent_unapplied_proxy_config", {"field": field}
    )


def test_zipkin_tracer_and_its_collector_cluster(tmp_path: Path) -> None:
    bootstrap = _bootstrap(tmp_path, {"zipkin": {"address": "zipkin.istio-system:9411"}, "sampling": 100})
    assert bootstrap["tracing"] == {
        "http": {
            "name": "envoy.tracers.zipkin",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.config.trace.v3.ZipkinConfig",
                "collector_cluster": "zipkin",
                "collector_endpoint": "/api/v2/spans",
                "collector_endpoint_version": "HTTP_JSON",
                "trace_id_128bit": True,
                "shared_span_context": False,
            },
        }
    }
    names = [c["name"] for c in bootstrap["static_resources"]["clusters"]]
    assert names == ["prometheus_stats", "agent", "sds-grpc", "xds-grpc", "zipkin"]
    zipkin = _cluster(bootstrap, "zipkin")
    assert "transport_socket" not in zipkin
    assert (zipkin["type"], zipkin["dns_lookup_family"], zipkin["dns_refresh_rate"]) == (
        "STRICT_DNS",
        "V4_ONLY",
        "30s",
    )
    endpoint = zipkin["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]
    assert endpoint["address"]["socket_address"] == {"address": "zipkin.istio-system", "port_value": 9411}


def test_zipkin_over_tls_verifies_the_collector_with_the_named_roots(tmp_path: Path) -> None:
    tls = {
        "mode": "SIMPLE",
        "caCertificates": "/etc/zipkin/ca.pem",
        "sni": "zipkin.example.com",
        "subjectAltNames": ["zipkin.example.com"],
    }
    bootstrap = _bootstrap(tmp_path, {"zipkin": {"address": "[fd00::9]:9411"}, "tlsSettings": tls})
    zipkin = _cluster(bootstrap, "zipkin")
    context = zipkin["transport_socket"]["typed_config"]
    assert context["sni"] == "zipkin.example.com"
    common = context["common_tls_context"]
    assert "alpn_protocols" not in common and "tls_certificate_sds_secret_configs" not in common
    validation = common["combined_validation_context"]
    assert validation["default_validation_context"] == {
        "match_subject_alt_names": [{"exact": "zipkin.example.com"}]
    }
    secret = validation["validation_context_sds_secret_config"]
    assert secret["name"] == "file-root:/etc/zipkin/ca.pem"
    assert secret["sds_config"]["api_config_source"]["grpc_services"] == [
        {"envoy_grpc": {"cluster_name": "sds-grpc"}}
    ]
    address = zipkin["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]
    assert address["socket_address"] == {"address": "fd00::9", "port_value": 9411}


def test_istio_mutual_uses_the_workload_certificate_and_the_tracer_sni(tmp_path: Path) -> None:
    bootstrap = _bootstrap(
        tmp_path, {"zipkin": {"address": "zipkin:9411"}, "tlsSettings": {"mode": "ISTIO_MUTUAL"}}
    )
    context = _cluster(bootstrap, "zipkin")["transport_socket"]["typed_config"]
    assert context["sni"] == "tracer"
    common = context["common_tls_context"]
    assert [s["name"] for s in common["tls_certificate_sds_secret_configs"]] == ["default"]
    assert common["combined_validation_context"]["validation_context_sds_secret_config"]["name"] == "ROOTCA"


def test_tls_settings_disabled_leave_the_cluster_plain(tmp_path: Path) -> None:
    bootstrap = _bootstrap(
        tmp_path, {"zipkin": {"address": "zipkin:9411"}, "tlsSettings": {"mode": "DISABLE"}}
    )
    assert "transport_socket" not in _cluster(bootstrap, "zipkin")


def test_node_metadata_client_root_wins_over_the_settings(tmp_path: Path) -> None:
    tls = {"mode": "SIMPLE", "caCertificates": "/etc/zipkin/ca.pem"}
    bootstrap = _bootstrap(
        tmp_path,
        {"zipkin": {"address": "zipkin:9411"}, "tlsSettings": tls},
        ISTIO_META_TLS_CLIENT_ROOT_CERT="/etc/certs/root.pem",
    )
    context = _cluster(bootstrap, "zipkin")["transport_socket"]["typed_config"]
    secret = context["common_tls_context"]["combined_validation_context"][
        "validation_context_sds_secret_config"
    ]
    assert secret["name"] == "file-root:/etc/certs/root.pem"


def test_datadog_names_the_service_after_the_node_cluster_and_resolves_host_ip(tmp_path: Path) -> None:
    bootstrap = _bootstrap(tmp_path, {"datadog": {"address": "$(HOST_IP):8126"}})
    assert bootstrap["node"]["cluster"] == "web.shop"
    assert bootstrap["tracing"]["http"] == {
        "name": "envoy.tracers.datadog",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.config.trace.v3.DatadogConfig",
            "collector_cluster": "datadog_agent",
            "service_name": "web.shop",
        },
    }
    datadog = _cluster(bootstrap, "datadog_agent")
    assert "dns_refresh_rate" not in datadog
    endpoint = datadog["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]
    assert endpoint["address"]["socket_address"] == {"address": "192.168.7.9", "port_value": 8126}


def test_sampling_and_tags_alone_make_no_tracer(tmp_path: Path) -> None:
    bootstrap = _bootstrap(tmp_path, {"sampling": 5, "customTags": {"a": {"literal": {"value": "b"}}}})
    assert "tracing" not in bootstrap
    assert len(bootstrap["static_resources"]["clusters"]) == 4


def test_a_later_layer_tracer_replaces_the_mesh_one(tmp_path: Path) -> None:
    root = _root(tmp_path)
    mesh = root / "etc/istio/config/mesh"
    mesh.parent.mkdir(parents=True)
    mesh.write_text("defaultConfig:\n  tracing:\n    sampling: 50\n    zipkin:\n      address: zipkin:9411\n")
    proxy_config = json.dumps({"tracing": {"datadog": {"address": "datadog:8126"}}})
    settings = load_settings(Flags(), {**ENV, "PROXY_CONFIG": proxy_config}, root)
    assert settings.proxy_config["tracing"] == {"sampling": 50, "datadog": {"address": "datadog:8126"}}
    names = [c["name"] for c in build_bootstrap(settings)["static_resources"]["clusters"]]
    assert names[-1] == "datadog_agent" and "zipkin" not in names


@pytest.mark.parametrize(
    ("tracing", "message"),
    [
        ({"zipkin": {"address": "zipkin"}}, "invalid zipkin config: unable to split"),
        ({"zipkin": {}}, "invalid zipkin config"),
        ({"datadog": {"address": "datadog:http"}}, "invalid datadog config: port (http) is not a number"),
        ({"zipkin": {"address": "a:1"}, "datadog": {"address": "b:2"}}, 'multiple "tracer" oneof fields'),
        ({"zipkin": {"address": "a:1"}, "tlsSettings": {"mode": "MUTUAL"}}, "invalid tracing TLS config"),
    ],
)
def test_bad_tracing_stops_the_agent_when_settings_are_read(
    tmp_path: Path, tracing: dict[str, Any], message: str
) -> None:
    with pytest.raises(SettingsError, match="ProxyConfig") as err:
        load_settings(Flags(), {**ENV, "PROXY_CONFIG": json.dumps({"tracing": tracing})}, _root(tmp_path))
    assert message in str(err.value)


@pytest.mark.parametrize(
    ("tracing", "message"),
    [
        (
            {"lightstep": {"address": "ls:443", "accessToken": "t"}},
            "Envoy no longer has the Lightstep tracer",
        ),
        ({"stackdriver": {"debug": True}}, "Envoy has no Stackdriver tracer"),
        ({"zipkin": {"address": "z:9411"}, "tlsSettings": {"mode": "SIMPLE"}}, "names no caCertificates"),
    ],
)
def test_tracers_the_proxy_could_not_start_with_are_refused(
    tmp_path: Path, tracing: dict[str, Any], message: str
) -> None:
    with pytest.raises(SettingsError, match=message):
        _bootstrap(tmp_path, tracing)


def test_opencensus_is_logged_and_counted_and_writes_no_tracer(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="meshpilot.agent.bootstrap_tracing"):
        bootstrap = _bootstrap(tmp_path, {"openCensusAgent": {"address": "oc:55678"}})
    assert "tracing" not in bootstrap
    assert "tracing.openCensusAgent is not applied" in caplog.text
    assert _unapplied("tracing.openCensusAgent") == 1


def test_tls_fields_pilot_agent_leaves_out_are_logged_and_counted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    tls = {"mode": "SIMPLE", "caCertificates": "/etc/ca.pem", "caCrl": "/etc/crl.pem"}
    with caplog.at_level(logging.WARNING, logger="meshpilot.agent.bootstrap_tracing"):
        bootstrap = _bootstrap(tmp_path, {"zipkin": {"address": "z:9411"}, "tlsSettings": tls})
    assert "transport_socket" in _cluster(bootstrap, "zipkin")
    assert "tracing.tlsSettings.caCrl is not applied" in caplog.text
    assert _unapplied("tracing.tlsSettings.caCrl") == 1
