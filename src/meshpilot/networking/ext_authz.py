"""MeshConfig ``extensionProviders`` of kind ``envoyExtAuthzHttp`` and ``envoyExtAuthzGrpc`` as the
Envoy ``ext_authz`` filter configs CUSTOM AuthorizationPolicies use, as istiod resolves them
(``security/authz/builder/extauthz.go``).

Every provider of those two kinds is resolved once per snapshot, usable or not: istiod checks its
name (a DNS label: it becomes part of RBAC policy names and metadata values), the fields its
MeshConfig validation checks (port, service, ``statusOnError``, ``pathPrefix``), the service
(``<host>`` found in exactly one namespace, or ``<namespace>/<host>``; the port is not checked
against the service's ports) and, for HTTP, a lone ``*`` in header lists. A provider with any
problem keeps its errors; a CUSTOM policy naming it, or naming no ext_authz provider at all, gets
istiod's deny filter instead (``authz_custom``). Providers of other kinds (tracing, access logs)
are not ext_authz providers: naming one is "not found".

The gRPC kind makes a network filter too (for TCP chains); the HTTP kind does not, so istiod leaves
CUSTOM policies of HTTP providers off TCP chains.
"""

from __future__ import annotations

import re
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from envoy.config.core.v3 import base_pb2, config_source_pb2, grpc_service_pb2, http_uri_pb2
from envoy.extensions.filters.http.ext_authz.v3 import ext_authz_pb2 as http_pb2
from envoy.extensions.filters.network.ext_authz.v3 import ext_authz_pb2 as tcp_pb2
from envoy.type.matcher.v3 import metadata_pb2, string_pb2, value_pb2
from envoy.type.v3 import http_status_pb2
from google.protobuf import duration_pb2

from meshpilot.config.validation.hosts import (
    is_ip_address,
    namespace_slash_host_errors,
    validate_fqdn,
    validate_port,
)
from meshpilot.model.push_context import PushContext
from meshpilot.networking.names import outbound_cluster

HTTP_EXT_AUTHZ = "envoy.filters.http.ext_authz"
TCP_EXT_AUTHZ = "envoy.filters.network.ext_authz"
#: What CUSTOM policy names start with; the ext_authz filter checks a request only when the RBAC
#: filter before it recorded a matching policy whose name starts with ``<this>-<provider>``.
POLICY_PREFIX = "istio-ext-authz"
#: The stat prefix of the RBAC filter's shadow rules for CUSTOM: Envoy writes the matched policy's
#: name into the filter's dynamic metadata under ``<prefix>shadow_effective_policy_id``.
SHADOW_STAT_PREFIX = "istio_ext_authz_"
SHADOW_POLICY_ID_KEY = SHADOW_STAT_PREFIX + "shadow_effective_policy_id"
#: istiod's timeout when the provider sets none.
DEFAULT_TIMEOUT_SECONDS = 600

_STATUS_CODES = frozenset(http_status_pb2.StatusCode.values())
_INT32 = re.compile(r"[+-]?[0-9]+")
_PROVIDER_NAME = re.compile(r"[a-z0-9-]+")
_BAD_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")


@dataclass(frozen=True, slots=True)
class ExtAuthzProvider:
    """One resolved provider: its filter configs (before ``filter_enabled_metadata`` is set), or
    the reasons it cannot be used."""

    name: str
    #: ``envoy.extensions.filters.http.ext_authz.v3.ExtAuthz``, or None when unusable.
    http: Any | None
    #: ``envoy.extensions.filters.network.ext_authz.v3.ExtAuthz``: gRPC providers only.
    tcp: Any | None
    errors: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ExtAuthzProviders:
    """The ext_authz providers of one snapshot's MeshConfig, by name."""

    providers: tuple[ExtAuthzProvider, ...] = ()

    def find(self, name: str) -> ExtAuthzProvider | str:
        """The usable provider ``name``, or why a CUSTOM policy naming it cannot use it."""
        for provider in self.providers:
            if provider.name == name:
                if provider.errors:
                    return f"found errors in provider {name}: {'; '.join(provider.errors)}"
                return provider
        known = sorted(p.name for p in self.providers)
        return f"available providers are {known} but found {name!r}"

    @property
    def key(self) -> Hashable:
        """What filters built from these providers read: each provider's configs and errors."""
        return tuple((p.name, _bytes(p.http), _bytes(p.tcp), p.errors) for p in self.providers)


NO_PROVIDERS = ExtAuthzProviders()


def _bytes(message: Any | None) -> bytes | None:
    return None if message is None else message.SerializeToString(deterministic=True)


class _Problems:
    """The errors of one provider, in istiod's order."""

    def __init__(self) -> None:
        self.errors: list[str] = []

    def add(self, error: str | None) -> None:
        if error:
            self.errors.append(error)


def providers(push: PushContext) -> ExtAuthzProviders:
    """The ext_authz providers of ``push``'s MeshConfig, resolved once per snapshot."""
    return push.memoized(("ext-authz-providers",), lambda: resolve(push.mesh.extension_providers, push))


def resolve(configs: Iterable[Any], push: PushContext) -> ExtAuthzProviders:
    """istiod's processExtensionProvider: each ext_authz provider built, or its errors kept. A later
    provider of a name already seen replaces the earlier one, with a duplicate-name error."""
    resolved: dict[str, ExtAuthzProvider] = {}
    for index, config in enumerate(configs):
        problems = _Problems()
        name = config.name
        if not name:
            problems.add(f"extension provider name must not be empty, found empty at index: {index}")
        elif name in resolved:
            problems.add(f"extension provider name must be unique, found duplicate: {name}")
        if name:
            problems.add(_provider_name_error(name))
        kind = config.WhichOneof("provider")
        if kind == "envoy_ext_authz_http":
            http, tcp = _http_provider(config.envoy_ext_authz_http, push, problems), None
        elif kind == "envoy_ext_authz_grpc":
            http, tcp = _grpc_provider(config.envoy_ext_authz_grpc, push, problems)
        else:
            continue
        if problems.errors:
            http = tcp = None
        resolved[name] = ExtAuthzProvider(name, http, tcp, tuple(problems.errors))
    return ExtAuthzProviders(tuple(resolved.values()))


def _provider_name_error(name: str) -> str | None:
    """Provider names become parts of RBAC policy names and metadata values: a DNS label."""
    if len(name) > 63:
        return f"invalid provider name {name!r}: too long (max 63 characters): {len(name)}"
    if not _PROVIDER_NAME.fullmatch(name):
        return f"invalid provider name {name!r}: only lowercase letters, digits and hyphens allowed"
    if name.startswith("-") or name.endswith("-"):
        return f"invalid provider name {name!r}: cannot start or end with a hyphen"
    return None


# -- fields -------------------------------------------------------------------------------------


def _service_error(service: str) -> str | None:
    if not service:
        return "service must not be empty"
    if "/" not in service:
        if validate_fqdn(service) and not is_ip_address(service):
            return f"invalid service fmt {service}: {service} is not a valid IP"
        return None
    errors = namespace_slash_host_errors(service, is_gateway=False, gateway_semantics=False)
    return "; ".join(errors) or None


def _status(value: str) -> tuple[Any | None, str | None]:
    """``statusOnError`` as an Envoy HttpStatus: a base-10 int32 naming one of Envoy's codes."""
    if not value:
        return None, None
    if not _INT32.fullmatch(value) or not -(2**31) <= int(value) < 2**31:
        return None, f"invalid statusOnError {value!r}: not a 32-bit integer"
    code = int(value)
    if code not in _STATUS_CODES:
        return None, f"unsupported statusOnError {value}, supported values: {sorted(_STATUS_CODES)}"
    return http_status_pb2.HttpStatus(code=code), None


def _path_prefix_errors(prefix: str) -> list[str]:
    if not prefix:
        return []
    errors = []
    # What Go's url.Parse refuses in a path: control characters and broken percent-escapes.
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in prefix) or _BAD_ESCAPE.search(prefix):
        errors.append(f"invalid pathPrefix {prefix!r}: not a valid URL path")
    if not prefix.startswith("/"):
        errors.append(f"pathPrefix must begin with `/`, found: {prefix!r}")
    return errors


def lookup_cluster(push: PushContext, service: str, port: int) -> tuple[str, str] | str:
    """istiod's LookupCluster: the service's hostname and its outbound cluster for ``port``."""
    namespace, slash, host = service.partition("/")
    if slash and "/" not in host:
        svc = push.service(host, namespace)
        if svc is not None:
            return svc.hostname, outbound_cluster(port, "", svc.hostname)
    elif not slash:
        found = push.services_for_hostname(service)
        if len(found) == 1:
            return found[0].hostname, outbound_cluster(port, "", found[0].hostname)
        if len(found) > 1:
            namespaces = sorted(s.namespace for s in found)
            return (
                f"found {service} in multiple namespaces {namespaces}, specify the namespace explicitly "
                "in the format of <Namespace>/<Hostname>"
            )
    return f"could not find service {service} in Istio service registry"


def _common(config: Any, push: PushContext, problems: _Problems) -> tuple[str, str, Any | None]:
    """What both kinds check and resolve: port, service and its cluster, ``statusOnError``."""
    problems.add(validate_port(config.port))
    problems.add(_service_error(config.service))
    status, error = _status(config.status_on_error)
    problems.add(error)
    if problems.errors:
        # istiod builds nothing (and looks nothing up) for a provider its validation refuses.
        return "", "", None
    found = lookup_cluster(push, config.service, config.port)
    if isinstance(found, str):
        problems.add(found)
        return "", "", None
    hostname, cluster = found
    return hostname, cluster, status


def _timeout(config: Any) -> Any:
    out = duration_pb2.Duration()
    if config.HasField("timeout"):
        out.CopyFrom(config.timeout)
    else:
        out.seconds = DEFAULT_TIMEOUT_SECONDS
    return out


def _body(config: Any) -> Any | None:
    if not config.HasField("include_request_body_in_check"):
        return None
    body = config.include_request_body_in_check
    return http_pb2.BufferSettings(
        max_request_bytes=body.max_request_bytes,
        allow_partial_message=body.allow_partial_message,
        pack_as_bytes=body.pack_as_bytes,
    )


def header_patterns(headers: Sequence[str]) -> Any | None:
    """Header names as istiod matches them, ignoring case: ``*x`` a suffix, ``x*`` a prefix, else
    the exact name; None for no names (Envoy's default set then applies)."""
    if not headers:
        return None
    patterns = []
    for header in headers:
        if header.startswith("*"):
            patterns.append(string_pb2.StringMatcher(suffix=header[1:], ignore_case=True))
        elif header.endswith("*"):
            patterns.append(string_pb2.StringMatcher(prefix=header[:-1], ignore_case=True))
        else:
            patterns.append(string_pb2.StringMatcher(exact=header, ignore_case=True))
    return string_pb2.ListStringMatcher(patterns=patterns)


_WILDCARD_FIELDS = (
    ("IncludeRequestHeadersInCheck", "include_request_headers_in_check"),
    ("IncludeHeadersInCheck", "include_headers_in_check"),
    ("HeadersToDownstreamOnDeny", "headers_to_downstream_on_deny"),
    ("HeadersToDownstreamOnAllow", "headers_to_downstream_on_allow"),
    ("HeadersToUpstreamOnAllow", "headers_to_upstream_on_allow"),
)


def _http_provider(config: Any, push: PushContext, problems: _Problems) -> Any | None:
    for error in _path_prefix_errors(config.path_prefix):
        problems.add(error)
    hostname, cluster, status = _common(config, push, problems)
    for label, field in _WILDCARD_FIELDS:
        if "*" in getattr(config, field):
            # Envoy would take "*" as a literal header name; istiod asks for a prefix or suffix.
            problems.add(
                'a single wildcard ("*") is not supported, change it to either prefix or suffix '
                f"match: {label}"
            )
    if problems.errors:
        return None
    service = http_pb2.HttpService(
        path_prefix=config.path_prefix,
        # Envoy requires the URI but sends to the cluster; the timeout is the check's.
        server_uri=http_uri_pb2.HttpUri(uri=f"http://{hostname}", cluster=cluster, timeout=_timeout(config)),
    )
    added = config.include_additional_headers_in_check
    if added:
        service.authorization_request.headers_to_add.extend(
            base_pb2.HeaderValue(key=k, value=added[k]) for k in sorted(added)
        )
    upstream = config.headers_to_upstream_on_allow
    on_deny = config.headers_to_downstream_on_deny
    on_allow = config.headers_to_downstream_on_allow
    if upstream or on_deny or on_allow:
        response = service.authorization_response
        response.SetInParent()
        for field, headers in (
            ("allowed_upstream_headers", upstream),
            ("allowed_client_headers", on_deny),
            ("allowed_client_headers_on_success", on_allow),
        ):
            patterns = header_patterns(headers)
            if patterns is not None:
                getattr(response, field).CopyFrom(patterns)
    out = http_pb2.ExtAuthz(
        failure_mode_allow=config.fail_open,
        transport_api_version=config_source_pb2.V3,
        http_service=service,
    )
    if status is not None:
        out.status_on_error.CopyFrom(status)
    # The deprecated includeHeadersInCheck counts only when includeRequestHeadersInCheck is empty.
    allowed = header_patterns(config.include_request_headers_in_check) or header_patterns(
        config.include_headers_in_check
    )
    if allowed is not None:
        out.allowed_headers.CopyFrom(allowed)
    body = _body(config)
    if body is not None:
        out.with_request_body.CopyFrom(body)
    return out


def _grpc_provider(config: Any, push: PushContext, problems: _Problems) -> tuple[Any | None, Any | None]:
    hostname, cluster, status = _common(config, push, problems)
    if problems.errors:
        return None, None
    grpc = grpc_service_pb2.GrpcService(
        envoy_grpc=grpc_service_pb2.GrpcService.EnvoyGrpc(cluster_name=cluster, authority=hostname),
        timeout=_timeout(config),
    )
    http = http_pb2.ExtAuthz(
        failure_mode_allow=config.fail_open,
        transport_api_version=config_source_pb2.V3,
        grpc_service=grpc,
    )
    if status is not None:
        http.status_on_error.CopyFrom(status)
    body = _body(config)
    if body is not None:
        http.with_request_body.CopyFrom(body)
    tcp = tcp_pb2.ExtAuthz(
        stat_prefix="tcp.",
        failure_mode_allow=config.fail_open,
        transport_api_version=config_source_pb2.V3,
        grpc_service=grpc,
    )
    return http, tcp


# -- which requests a filter checks ----------------------------------------------------------------


def enabled_for(rbac_filter: str, provider: str) -> Any:
    """The ``filter_enabled_metadata`` of a provider's ext_authz filter: the RBAC filter before it
    (``rbac_filter``) matched one of this provider's CUSTOM policies, whose names all start with
    ``istio-ext-authz-<provider>``. A request no CUSTOM rule covers is not sent to the provider."""
    return metadata_pb2.MetadataMatcher(
        filter=rbac_filter,
        path=[metadata_pb2.MetadataMatcher.PathSegment(key=SHADOW_POLICY_ID_KEY)],
        value=value_pb2.ValueMatcher(
            string_match=string_pb2.StringMatcher(prefix=f"{POLICY_PREFIX}-{provider}")
        ),
    )


def with_enabled(config: Any, rbac_filter: str, provider: str) -> Any:
    """A copy of a provider's filter config that checks only what its CUSTOM policies cover."""
    out = type(config)()
    out.CopyFrom(config)
    out.filter_enabled_metadata.CopyFrom(enabled_for(rbac_filter, provider))
    return out
