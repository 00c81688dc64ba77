"""Access loggers on sidecar listeners: MeshConfig accessLogFile, and the Telemetry API's providers."""

from __future__ import annotations

from typing import Any

from envoy.extensions.access_loggers.file.v3 import file_pb2
from envoy.extensions.access_loggers.filters.cel.v3 import cel_pb2
from envoy.extensions.access_loggers.open_telemetry.v3 import logs_service_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2 as hcm_pb2
from envoy.extensions.filters.network.tcp_proxy.v3 import tcp_proxy_pb2
from google.protobuf import json_format
from support.kube import istio, service
from support.mesh_objects import CLIENT, mesh_objects
from support.model import Model, build

from meshpilot.model.telemetry import TelemetryClass
from meshpilot.networking import access_log
from meshpilot.networking.listener import build_outbound_listeners, virtual_outbound
from meshpilot.networking.listener_inbound import build_inbound_listeners
from meshpilot.networking.telemetry_problems import TELEMETRY_PROBLEMS, report_undefined

SERVER = "sidecar~10.1.0.21~reviews-v1.default~default.svc.cluster.local"


def _file(logger: Any) -> Any:
    out = file_pb2.FileAccessLog()
    assert logger.typed_config.Unpack(out)
    return out


def _filters(listener: Any, name: str) -> list[Any]:
    """The unpacked filters named ``name`` of every chain (default chain included)."""
    kinds = {
        "envoy.filters.network.http_connection_manager": hcm_pb2.HttpConnectionManager,
        "envoy.filters.network.tcp_proxy": tcp_proxy_pb2.TcpProxy,
    }
    chains = [*listener.filter_chains]
    if listener.HasField("default_filter_chain"):
        chains.append(listener.default_filter_chain)
    out = []
    for chain in chains:
        for f in chain.filters:
            if f.name == name:
                message = kinds[name]()
                f.typed_config.Unpack(message)
                out.append(message)
    return out


def _listeners(model: Model, node: str = CLIENT) -> dict[str, Any]:
    proxy = model.proxy(node, {"INTERCEPTION_MODE": "REDIRECT"})
    found = [
        *build_outbound_listeners(proxy, model.push, model.index),
        *build_inbound_listeners(proxy, model.push),
    ]
    return {listener.name: listener for listener in found}


def test_without_access_log_file_nothing_is_logged() -> None:
    listeners = _listeners(build(mesh_objects()))
    for listener in listeners.values():
        assert not listener.access_log
        for name in ("envoy.filters.network.http_connection_manager", "envoy.filters.network.tcp_proxy"):
            assert all(not f.access_log for f in _filters(listener, name)), listener.name


def test_access_log_file_logs_every_filter_and_unmatched_connections() -> None:
    listeners = _listeners(build(mesh_objects(), "accessLogFile: /var/log/envoy.log\n"))
    http = _filters(listeners["0.0.0.0_9080"], "envoy.filters.network.http_connection_manager")
    tcp = _filters(listeners["10.96.0.40_3306"], "envoy.filters.network.tcp_proxy")
    passthrough = _filters(listeners["virtualOutbound"], "envoy.filters.network.tcp_proxy")
    inbound = _filters(listeners["virtualInbound"], "envoy.filters.network.tcp_proxy")
    for found in (http, tcp, inbound[1:]):
        assert found and all(len(f.access_log) == 1 for f in found)
    text = _file(http[0].access_log[0])
    assert text.path == "/var/log/envoy.log"
    assert text.log_format.text_format_source.inline_string == access_log.TEXT_FORMAT
    # The blackhole chains log nothing; the catch-all passthrough does.
    assert [len(f.access_log) for f in passthrough] == [0, 1]
    assert inbound[0].cluster == "BlackHoleCluster" and not inbound[0].access_log
    for name in ("virtualOutbound", "virtualInbound"):
        (logger,) = listeners[name].access_log
        assert list(logger.filter.response_flag_filter.flags) == ["NR"]
        assert _file(logger).path == "/var/log/envoy.log"
    # Per-port outbound listeners have no listener-level logger (istiod puts none there).
    assert not listeners["0.0.0.0_9080"].access_log


def test_a_custom_text_format_gets_its_newline_and_formatter() -> None:
    mesh = 'accessLogFile: /dev/stdout\naccessLogFormat: "%REQ_WITHOUT_QUERY(:PATH)% %RESPONSE_CODE%"\n'
    model = build(mesh_objects(), mesh)
    proxy = model.proxy(CLIENT)
    (logger,) = access_log.filter_loggers(model.push, proxy, TelemetryClass.CLIENT, http=True)
    fmt = _file(logger).log_format
    assert fmt.text_format_source.inline_string == "%REQ_WITHOUT_QUERY(:PATH)% %RESPONSE_CODE%\n"
    assert [f.name for f in fmt.formatters] == ["envoy.formatter.req_without_query"]


def _tcp_logger(mesh: str) -> Any:
    model = build(mesh_objects(), mesh)
    (logger,) = access_log.filter_loggers(model.push, model.proxy(CLIENT), TelemetryClass.CLIENT, http=False)
    return _file(logger).log_format


def test_json_encoding_uses_the_format_or_istiods_labels() -> None:
    json_mesh = "accessLogFile: /dev/stdout\naccessLogEncoding: JSON\n"
    fmt = _tcp_logger(json_mesh + """accessLogFormat: '{"code": "%RESPONSE_CODE%"}'\n""")
    assert json_format.MessageToDict(fmt.json_format) == {"code": "%RESPONSE_CODE%"}
    assert fmt.json_format_options.sort_properties is False
    labels = json_format.MessageToDict(_tcp_logger(json_mesh + "accessLogFormat: 'nope'\n").json_format)
    assert labels == access_log.JSON_LABELS
    # Every operator of the default text format is a JSON label too.
    for value in labels.values():
        assert value in access_log.TEXT_FORMAT


def test_mesh_loggers_are_built_once_and_shared() -> None:
    model = build(mesh_objects(), "accessLogFile: /dev/stdout\n")
    client, server = model.proxy(CLIENT), model.proxy(SERVER)
    first = access_log.filter_loggers(model.push, client, TelemetryClass.CLIENT, http=True)
    assert access_log.filter_loggers(model.push, server, TelemetryClass.SERVER, http=True) is first


def test_disable_envoy_listener_log_keeps_filter_loggers() -> None:
    model = build(mesh_objects(), "accessLogFile: /dev/stdout\ndisableEnvoyListenerLog: true\n")
    proxy = model.proxy(CLIENT, {"INTERCEPTION_MODE": "REDIRECT"})
    listener = virtual_outbound(proxy, model.push)
    assert not listener.access_log
    assert _filters(listener, "envoy.filters.network.tcp_proxy")[1].access_log


_PROVIDERS = """
extensionProviders:
- name: otel
  envoyOtelAls:
    service: otel.observability.svc.cluster.local
    port: 4317
    logFormat: {labels: {code: "%RESPONSE_CODE%"}}
- name: missing
  envoyOtelAls: {service: nowhere.example.com, port: 4317}
- name: sd
  stackdriver: {}
"""


def _telemetry(providers: list[str], expression: str | None = None, **extra: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {"providers": [{"name": p} for p in providers], **extra}
    if expression:
        entry["filter"] = {"expression": expression}
    return istio("Telemetry", "mesh", "istio-system", {"accessLogging": [entry]}, group="telemetry")


def _otel_mesh(*telemetry: dict[str, Any]) -> Model:
    collector = service("otel", "observability", "10.96.9.1", [("grpc", 4317)])
    return build([*mesh_objects(), collector, *telemetry], "accessLogFile: /dev/stdout\n" + _PROVIDERS)


def test_telemetry_provider_replaces_the_mesh_file_and_filters_by_cel() -> None:
    model = _otel_mesh(_telemetry(["otel"], "response.code >= 500"))
    proxy = model.proxy(CLIENT)
    (logger,) = access_log.filter_loggers(model.push, proxy, TelemetryClass.CLIENT, http=True)
    assert logger.name == "envoy.access_loggers.open_telemetry"
    config = logs_service_pb2.OpenTelemetryAccessLogConfig()
    logger.typed_config.Unpack(config)
    grpc = config.common_config.grpc_service.envoy_grpc
    assert grpc.cluster_name == "outbound|4317||otel.observability.svc.cluster.local"
    assert grpc.authority == "otel.observability.svc.cluster.local"
    assert config.body.string_value == access_log.TEXT_FORMAT
    assert [(a.key, a.value.string_value) for a in config.attributes.values] == [("code", "%RESPONSE_CODE%")]
    cel = cel_pb2.ExpressionFilter()
    assert logger.filter.extension_filter.name == "envoy.access_loggers.extension_filters.cel"
    logger.filter.extension_filter.typed_config.Unpack(cel)
    assert cel.expression == "response.code >= 500"
    (listener_logger,) = access_log.listener_loggers(model.push, proxy, TelemetryClass.CLIENT)
    first, second = listener_logger.filter.and_filter.filters
    assert list(first.response_flag_filter.flags) == ["NR"]
    assert second.extension_filter.name == "envoy.access_loggers.extension_filters.cel"


def test_a_provider_whose_collector_is_unknown_is_counted_and_the_mesh_file_applies() -> None:
    before = TELEMETRY_PROBLEMS.count("envoyOtelAls", "missing")
    model = _otel_mesh(_telemetry(["missing"]))
    proxy = model.proxy(CLIENT)
    # istiod's AccessLogging drops a provider it cannot build; with none left, accessLogFile applies.
    (logger,) = access_log.filter_loggers(model.push, proxy, TelemetryClass.CLIENT, http=True)
    assert logger.name == "envoy.access_loggers.file"
    assert TELEMETRY_PROBLEMS.count("envoyOtelAls", "missing") > before


def test_a_provider_that_writes_no_access_logs_is_counted_and_the_mesh_file_applies() -> None:
    before = TELEMETRY_PROBLEMS.count("stackdriver", "sd")
    model = _otel_mesh(_telemetry(["sd"]))
    proxy = model.proxy(CLIENT)
    # istiod builds no logger for it (nor counts it), and with none left accessLogFile applies.
    (logger,) = access_log.filter_loggers(model.push, proxy, TelemetryClass.CLIENT, http=True)
    assert logger.name == "envoy.access_loggers.file"
    assert TELEMETRY_PROBLEMS.count("stackdriver", "sd") > before


def test_a_provider_missing_from_meshconfig_is_counted_by_name() -> None:
    before = TELEMETRY_PROBLEMS.count("undefined", "no-such-provider")
    model = _otel_mesh(_telemetry(["otel", "no-such-provider"]))
    proxy = model.proxy(CLIENT)
    (logger,) = access_log.filter_loggers(model.push, proxy, TelemetryClass.CLIENT, http=True)
    assert logger.name == "envoy.access_loggers.open_telemetry"
    report_undefined(model.push, proxy)
    report_undefined(model.push, model.proxy(CLIENT))
    # Once per snapshot for the objects in scope, however many proxies ask.
    assert TELEMETRY_PROBLEMS.count("undefined", "no-such-provider") == before + 1


def test_a_disabled_provider_turns_off_the_mesh_file_too() -> None:
    model = _otel_mesh(_telemetry(["envoy"], disabled=True))
    proxy = model.proxy(CLIENT)
    assert access_log.filter_loggers(model.push, proxy, TelemetryClass.CLIENT, http=True) == []
    assert access_log.listener_loggers(model.push, proxy, TelemetryClass.CLIENT) == []


def test_builtin_envoy_provider_takes_meshconfig_format() -> None:
    model = _otel_mesh(_telemetry(["envoy"]))
    mesh_format = build(mesh_objects(), "accessLogFile: /dev/stdout\n")
    proxy = model.proxy(CLIENT)
    (logger,) = access_log.filter_loggers(model.push, proxy, TelemetryClass.CLIENT, http=True)
    (legacy,) = access_log.filter_loggers(
        mesh_format.push, mesh_format.proxy(CLIENT), TelemetryClass.CLIENT, http=True
    )
    assert logger == legacy
