"""Envoy access loggers of sidecar and gateway listeners, as istiod writes them.

Two sources, as in istiod's accesslog.go: the Telemetry API's ``accessLogging`` (and MeshConfig
``defaultProviders.accessLogging``), resolved per proxy by ``model.telemetry``; when none applies,
or no provider it names gives a logger (istiod falls back then too), the legacy MeshConfig fields
``accessLogFile`` (with ``accessLogFormat`` and ``accessLogEncoding``) and
``enableEnvoyAccessLogService``. Loggers go on three places, each with its own filter:

- HTTP connection managers and tcp_proxy filters: every request or connection;
- a listener's own ``access_log`` (virtualOutbound, virtualInbound, listeners that bind a port,
  gateway listeners): only connections no filter chain took (response flag ``NR``), which no
  filter's logger sees.

A logger built from MeshConfig alone is the same for every proxy, so it is built once per MeshConfig
and shared (istiod caches it too); those from the Telemetry API once per snapshot and side for the
objects in scope. Providers that give no logger are logged and counted by name (``telemetry_problems``).
"""

from __future__ import annotations

import enum
import json
import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from envoy.config.accesslog.v3 import accesslog_pb2
from envoy.config.core.v3 import (
    config_source_pb2,
    extension_pb2,
    grpc_service_pb2,
    substitution_format_string_pb2,
)
from envoy.extensions.access_loggers.file.v3 import file_pb2
from envoy.extensions.access_loggers.filters.cel.v3 import cel_pb2
from envoy.extensions.access_loggers.grpc.v3 import als_pb2
from envoy.extensions.access_loggers.open_telemetry.v3 import logs_service_pb2
from envoy.extensions.formatter.req_without_query.v3 import req_without_query_pb2
from google.protobuf import struct_pb2

from meshpilot.model import telemetry
from meshpilot.model.mesh import MeshConfig
from meshpilot.model.proxy import Proxy
from meshpilot.model.push_context import PushContext
from meshpilot.model.telemetry import LoggingConfig, TelemetryClass
from meshpilot.networking.ext_authz import lookup_cluster
from meshpilot.networking.protobuf import pack
from meshpilot.networking.telemetry_problems import provider_problem

log = logging.getLogger(__name__)

FILE_LOGGER = "envoy.access_loggers.file"
HTTP_GRPC_LOGGER = "envoy.access_loggers.http_grpc"
TCP_GRPC_LOGGER = "envoy.tcp_grpc_access_log"
OTEL_LOGGER = "envoy.access_loggers.open_telemetry"
CEL_FILTER = "envoy.access_loggers.extension_filters.cel"
#: The bootstrap's cluster for MeshConfig ``enableEnvoyAccessLogService``.
ALS_CLUSTER = "envoy_accesslog_service"

#: istiod's default text format (Istio 1.9 onwards).
TEXT_FORMAT = (
    '[%START_TIME%] "%REQ(:METHOD)% %REQ(X-ENVOY-ORIGINAL-PATH?:PATH)% %PROTOCOL%" '
    "%RESPONSE_CODE% %RESPONSE_FLAGS% %RESPONSE_CODE_DETAILS% %CONNECTION_TERMINATION_DETAILS% "
    '"%UPSTREAM_TRANSPORT_FAILURE_REASON%" %BYTES_RECEIVED% %BYTES_SENT% %DURATION% '
    '%RESP(X-ENVOY-UPSTREAM-SERVICE-TIME)% "%REQ(X-FORWARDED-FOR)%" "%REQ(USER-AGENT)%" '
    '"%REQ(X-REQUEST-ID)%" "%REQ(:AUTHORITY)%" "%UPSTREAM_HOST%" %UPSTREAM_CLUSTER_RAW% '
    "%UPSTREAM_LOCAL_ADDRESS% %DOWNSTREAM_LOCAL_ADDRESS% %DOWNSTREAM_REMOTE_ADDRESS% "
    "%REQUESTED_SERVER_NAME% %ROUTE_NAME%\n"
)

#: istiod's default JSON labels, the same fields as the text format.
JSON_LABELS: dict[str, str] = {
    "start_time": "%START_TIME%",
    "route_name": "%ROUTE_NAME%",
    "method": "%REQ(:METHOD)%",
    "path": "%REQ(X-ENVOY-ORIGINAL-PATH?:PATH)%",
    "protocol": "%PROTOCOL%",
    "response_code": "%RESPONSE_CODE%",
    "response_flags": "%RESPONSE_FLAGS%",
    "response_code_details": "%RESPONSE_CODE_DETAILS%",
    "connection_termination_details": "%CONNECTION_TERMINATION_DETAILS%",
    "bytes_received": "%BYTES_RECEIVED%",
    "bytes_sent": "%BYTES_SENT%",
    "duration": "%DURATION%",
    "upstream_service_time": "%RESP(X-ENVOY-UPSTREAM-SERVICE-TIME)%",
    "x_forwarded_for": "%REQ(X-FORWARDED-FOR)%",
    "user_agent": "%REQ(USER-AGENT)%",
    "request_id": "%REQ(X-REQUEST-ID)%",
    "authority": "%REQ(:AUTHORITY)%",
    "upstream_host": "%UPSTREAM_HOST%",
    "upstream_cluster": "%UPSTREAM_CLUSTER_RAW%",
    "upstream_local_address": "%UPSTREAM_LOCAL_ADDRESS%",
    "downstream_local_address": "%DOWNSTREAM_LOCAL_ADDRESS%",
    "downstream_remote_address": "%DOWNSTREAM_REMOTE_ADDRESS%",
    "requested_server_name": "%REQUESTED_SERVER_NAME%",
    "upstream_transport_failure_reason": "%UPSTREAM_TRANSPORT_FAILURE_REASON%",
}

_REQ_WITHOUT_QUERY = "%REQ_WITHOUT_QUERY"
#: Peer metadata the metadata-exchange filters leave in filter state, old keys and new.
_FILTER_STATE_TO_LOG = (
    "upstream_peer",
    "downstream_peer",
    "wasm.upstream_peer",
    "wasm.upstream_peer_id",
    "wasm.downstream_peer",
    "wasm.downstream_peer_id",
)
_TELEMETRY_FILTER_STATE = ("upstream_peer", "downstream_peer")


class Place(enum.Enum):
    """Where a logger goes; the listener's own logger sees only connections no chain took."""

    FILTER = "filter"
    LISTENER = "listener"


def _listener_filter() -> Any:
    return accesslog_pb2.AccessLogFilter(response_flag_filter=accesslog_pb2.ResponseFlagFilter(flags=["NR"]))


def _req_without_query() -> Any:
    return extension_pb2.TypedExtensionConfig(
        name="envoy.formatter.req_without_query", typed_config=pack(req_without_query_pb2.ReqWithoutQuery())
    )


def _with_newline(text: str) -> str:
    """The format, or istiod's default; Istio ends every text format with a newline."""
    if not text:
        return TEXT_FORMAT
    return text if text.endswith("\n") else text + "\n"


def _text_format(text: str, omit_empty: bool = False) -> Any:
    fmt = substitution_format_string_pb2.SubstitutionFormatString(omit_empty_values=omit_empty)
    fmt.text_format_source.inline_string = text
    if _REQ_WITHOUT_QUERY in text:
        fmt.formatters.append(_req_without_query())
    return fmt


def _json_format(labels: Any, omit_empty: bool = False) -> Any:
    fmt = substitution_format_string_pb2.SubstitutionFormatString(omit_empty_values=omit_empty)
    fmt.json_format.CopyFrom(labels)
    fmt.json_format_options.sort_properties = False
    if any(_REQ_WITHOUT_QUERY in v.string_value for v in labels.fields.values()):
        fmt.formatters.append(_req_without_query())
    return fmt


def _default_labels() -> Any:
    labels = struct_pb2.Struct()
    labels.update(JSON_LABELS)
    return labels


def _file_logger(path: str, fmt: Any) -> Any:
    config = file_pb2.FileAccessLog(path=path, log_format=fmt)
    return accesslog_pb2.AccessLog(name=FILE_LOGGER, typed_config=pack(config))


def _mesh_file_logger(path: str, mesh: Any) -> Any:
    """istiod's file logger from MeshConfig's ``accessLogFormat`` and ``accessLogEncoding``."""
    if mesh.access_log_encoding == MeshConfig.JSON:
        labels = _default_labels()
        if mesh.access_log_format:
            try:
                parsed = json.loads(mesh.access_log_format)
                if not isinstance(parsed, dict):
                    raise ValueError("not a JSON object")
                labels = struct_pb2.Struct()
                labels.update(parsed)
            except ValueError as err:
                # istiod logs the same and falls back to its default labels.
                log.error(
                    "MeshConfig accessLogFormat is not a JSON object, the default labels are used: %s", err
                )
                labels = _default_labels()
        return _file_logger(path, _json_format(labels))
    return _file_logger(path, _text_format(_with_newline(mesh.access_log_format)))


def _grpc_common(log_name: str, cluster: str, authority: str, state: Sequence[str]) -> Any:
    service = grpc_service_pb2.GrpcService()
    service.envoy_grpc.cluster_name = cluster
    if authority:
        service.envoy_grpc.authority = authority
    return als_pb2.CommonGrpcAccessLogConfig(
        log_name=log_name,
        grpc_service=service,
        transport_api_version=config_source_pb2.V3,
        filter_state_objects_to_log=list(state),
    )


def _mesh_als(log_name: str, *, tcp: bool) -> Any:
    """A logger to the bootstrap's access log service (MeshConfig ``enableEnvoyAccessLogService``)."""
    common = _grpc_common(log_name, ALS_CLUSTER, "", _FILTER_STATE_TO_LOG)
    if tcp:
        config: Any = als_pb2.TcpGrpcAccessLogConfig(common_config=common)
        return accesslog_pb2.AccessLog(name=TCP_GRPC_LOGGER, typed_config=pack(config))
    config = als_pb2.HttpGrpcAccessLogConfig(common_config=common)
    return accesslog_pb2.AccessLog(name=HTTP_GRPC_LOGGER, typed_config=pack(config))


def _filtered(logger: Any, filter_: Any) -> Any:
    out = accesslog_pb2.AccessLog()
    out.CopyFrom(logger)
    out.filter.CopyFrom(filter_)
    return out


class _MeshLoggers:
    """The MeshConfig loggers of one MeshConfig, built once and shared by every proxy."""

    def __init__(self, mesh: Any) -> None:
        self.http: list[Any] = []
        self.tcp: list[Any] = []
        self.listener: list[Any] = []
        if mesh.access_log_file:
            core = _mesh_file_logger(mesh.access_log_file, mesh)
            self.http.append(core)
            self.tcp.append(core)
            self.listener.append(_filtered(core, _listener_filter()))
        if mesh.enable_envoy_access_log_service:
            self.http.append(_mesh_als("http_envoy_accesslog", tcp=False))
            self.tcp.append(_mesh_als("tcp_envoy_accesslog", tcp=True))
            listener = _mesh_als("listener_envoy_accesslog", tcp=True)
            self.listener.append(_filtered(listener, _listener_filter()))


_mesh_lock = threading.Lock()
_mesh_loggers: dict[int, _MeshLoggers] = {}


def _for_mesh(push: PushContext) -> _MeshLoggers:
    key = push.mesh_fingerprint
    found = _mesh_loggers.get(key)
    if found is None:
        found = _MeshLoggers(push.mesh)
        with _mesh_lock:
            if len(_mesh_loggers) > 8:
                _mesh_loggers.clear()
            _mesh_loggers[key] = found
    return found


# -- Telemetry API providers --------------------------------------------------------------------


def _provider_file_logger(push: PushContext, provider: Any) -> Any:
    settings = provider.envoy_file_access_log
    if provider.name == "envoy" and not settings.HasField("log_format") and not settings.omit_empty_values:
        # The built-in provider takes its format from MeshConfig, as istiod's does.
        return _mesh_file_logger(settings.path, push.mesh)
    omit = settings.omit_empty_values
    kind = settings.log_format.WhichOneof("log_format") if settings.HasField("log_format") else None
    if kind == "labels":
        labels = settings.log_format.labels if settings.log_format.labels.fields else _default_labels()
        fmt = _json_format(labels, omit)
    else:
        fmt = _text_format(_with_newline(settings.log_format.text if kind == "text" else ""), omit)
    return _file_logger(settings.path or "/dev/stdout", fmt)


def _resolved(push: PushContext, provider: Any, settings: Any) -> tuple[str, str] | None:
    found = lookup_cluster(push, settings.service, settings.port)
    if isinstance(found, str):
        provider_problem(provider, f"could not find cluster for access log provider: {found}")
        return None
    return found


def _provider_grpc_logger(push: PushContext, provider: Any, tcp: bool) -> Any | None:
    settings = provider.envoy_tcp_als if tcp else provider.envoy_http_als
    found = _resolved(push, provider, settings)
    if found is None:
        return None
    hostname, cluster = found
    default_name = "tcp_envoy_accesslog" if tcp else "http_envoy_accesslog"
    state = list(settings.filter_state_objects_to_log) or list(_TELEMETRY_FILTER_STATE)
    common = _grpc_common(settings.log_name or default_name, cluster, hostname, state)
    if tcp:
        config: Any = als_pb2.TcpGrpcAccessLogConfig(common_config=common)
        return accesslog_pb2.AccessLog(name=TCP_GRPC_LOGGER, typed_config=pack(config))
    config = als_pb2.HttpGrpcAccessLogConfig(
        common_config=common,
        additional_request_headers_to_log=list(settings.additional_request_headers_to_log),
        additional_response_headers_to_log=list(settings.additional_response_headers_to_log),
        additional_response_trailers_to_log=list(settings.additional_response_trailers_to_log),
    )
    return accesslog_pb2.AccessLog(name=HTTP_GRPC_LOGGER, typed_config=pack(config))


def _provider_otel_logger(push: PushContext, provider: Any) -> Any | None:
    settings = provider.envoy_otel_als
    found = _resolved(push, provider, settings)
    if found is None:
        return None
    hostname, cluster = found
    text = settings.log_format.text or TEXT_FORMAT
    labels = settings.log_format.labels if settings.log_format.labels.fields else None
    config = logs_service_pb2.OpenTelemetryAccessLogConfig(
        common_config=_grpc_common(
            settings.log_name or "otel_envoy_accesslog", cluster, hostname, _FILTER_STATE_TO_LOG
        ),
        disable_builtin_labels=True,
    )
    config.body.string_value = text
    if labels is not None:
        for key in sorted(labels.fields):
            attribute = config.attributes.values.add(key=key)
            attribute.value.string_value = labels.fields[key].string_value
    needs = _REQ_WITHOUT_QUERY in text or (
        labels is not None and any(_REQ_WITHOUT_QUERY in v.string_value for v in labels.fields.values())
    )
    if needs:
        config.formatters.append(_req_without_query())
    return accesslog_pb2.AccessLog(name=OTEL_LOGGER, typed_config=pack(config))


def provider_logger(push: PushContext, provider: Any) -> Any | None:
    """The logger one MeshConfig extension provider configures, or None (logged and counted)."""
    kind = provider.WhichOneof("provider")
    if kind == "envoy_file_access_log":
        return _provider_file_logger(push, provider)
    if kind == "envoy_http_als":
        return _provider_grpc_logger(push, provider, tcp=False)
    if kind == "envoy_tcp_als":
        return _provider_grpc_logger(push, provider, tcp=True)
    if kind == "envoy_otel_als":
        return _provider_otel_logger(push, provider)
    # istiod passes over these without a word (stackdriver's logging was part of its stats plugin,
    # which neither builds any more); the Telemetry asked for logs that will not be written.
    provider_problem(provider, f"a {kind} provider writes no access logs; accessLogging naming it is ignored")
    return None


def _cel_filter(expression: str) -> Any:
    out = accesslog_pb2.AccessLogFilter()
    out.extension_filter.name = CEL_FILTER
    out.extension_filter.typed_config.CopyFrom(pack(cel_pb2.ExpressionFilter(expression=expression)))
    return out


def _placed(base: Any, config: LoggingConfig, place: Place) -> Any:
    filters = []
    if place is Place.LISTENER:
        filters.append(_listener_filter())
    if config.filter_expression:
        filters.append(_cel_filter(config.filter_expression))
    out = accesslog_pb2.AccessLog(name=base.name)
    out.typed_config.CopyFrom(base.typed_config)
    if len(filters) == 1:
        out.filter.CopyFrom(filters[0])
    elif filters:
        out.filter.and_filter.filters.extend(filters)
    return out


@dataclass(frozen=True, slots=True)
class _TelemetryLoggers:
    """The loggers of one side from the Telemetry API, for filters and for the listener itself."""

    filter: list[Any]
    listener: list[Any]
    #: Both, serialized: part of the cache keys of listeners holding them.
    fingerprint: tuple[bytes, ...]


def _build(push: PushContext, configs: Sequence[LoggingConfig]) -> _TelemetryLoggers | None:
    """The loggers of ``configs``, or None when none could be built: then, as istiod does, MeshConfig's
    legacy loggers apply. A provider a Telemetry disabled counts as built (it is built, as istiod
    does, and not written), so that it keeps the legacy ones off."""
    built = [(c, b) for c in configs if (b := provider_logger(push, c.provider)) is not None]
    if not built:
        return None
    on = [(c, b) for c, b in built if not c.disabled]
    filter_ = [_placed(b, c, Place.FILTER) for c, b in on]
    listener = [_placed(b, c, Place.LISTENER) for c, b in on]
    fingerprint = tuple(a.SerializeToString(deterministic=True) for a in (*filter_, *listener))
    return _TelemetryLoggers(filter_, listener, fingerprint)


def _telemetry(push: PushContext, proxy: Proxy, cls: TelemetryClass) -> _TelemetryLoggers | None:
    scope = telemetry.applicable(push, proxy)
    if not scope.logging and not push.mesh.default_providers.access_logging:
        return None
    found: _TelemetryLoggers | None = telemetry.derived(
        push, scope, ("access-loggers", cls), lambda: _build(push, telemetry.access_logging(push, proxy, cls))
    )
    return found


# -- where they go ------------------------------------------------------------------------------


def filter_loggers(push: PushContext, proxy: Proxy, cls: TelemetryClass, *, http: bool) -> list[Any]:
    """Loggers of an HTTP connection manager (``http``) or a tcp_proxy."""
    found = _telemetry(push, proxy, cls)
    if found is not None:
        return found.filter
    mesh = _for_mesh(push)
    return mesh.http if http else mesh.tcp


def listener_loggers(push: PushContext, proxy: Proxy, cls: TelemetryClass) -> list[Any]:
    """A listener's own loggers: connections no filter chain took (``NR``)."""
    if push.mesh.disable_envoy_listener_log:
        return []
    found = _telemetry(push, proxy, cls)
    if found is not None:
        return found.listener
    return _for_mesh(push).listener


def key(push: PushContext, proxy: Proxy) -> tuple[object, ...]:
    """The proxy's Telemetry API loggers, for cache keys of what holds them.

    MeshConfig's loggers are the same for every proxy (and MeshConfig is in every key). Telemetry
    ones are keyed by what was built, since whether a provider's service exists is part of it.
    """
    return tuple(
        None if (found := _telemetry(push, proxy, cls)) is None else found.fingerprint
        for cls in TelemetryClass
    )
