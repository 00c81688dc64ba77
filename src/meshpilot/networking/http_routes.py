"""VirtualService HTTP routes translated into Envoy routes, as istiod translates them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from envoy.config.core.v3 import base_pb2
from envoy.config.route.v3 import route_components_pb2 as rc
from envoy.extensions.filters.http.cors.v3 import cors_pb2
from envoy.extensions.filters.http.fault.v3 import fault_pb2
from envoy.type.matcher.v3 import string_pb2
from envoy.type.v3 import percent_pb2

from meshpilot.model.config import Config
from meshpilot.model.gateways import GatewayRef, gateway_match
from meshpilot.model.hosts import resolve_short_name
from meshpilot.model.labels import selector_matches
from meshpilot.model.proxy import Proxy
from meshpilot.model.service import Service
from meshpilot.networking import names
from meshpilot.networking.protobuf import boolean, duration, pack, uint32
from meshpilot.networking.route_hashing import LookupHash, hash_policy, no_hash
from meshpilot.networking.route_matches import is_catch_all, route_match, string_matcher
from meshpilot.networking.route_retries import retry_policy

_GRPC_CODES = {
    "OK": 0,
    "CANCELLED": 1,
    "UNKNOWN": 2,
    "INVALID_ARGUMENT": 3,
    "DEADLINE_EXCEEDED": 4,
    "NOT_FOUND": 5,
    "ALREADY_EXISTS": 6,
    "PERMISSION_DENIED": 7,
    "RESOURCE_EXHAUSTED": 8,
    "FAILED_PRECONDITION": 9,
    "ABORTED": 10,
    "OUT_OF_RANGE": 11,
    "UNIMPLEMENTED": 12,
    "INTERNAL": 13,
    "UNAVAILABLE": 14,
    "DATA_LOSS": 15,
    "UNAUTHENTICATED": 16,
}
_REDIRECT_CODES = {
    0: rc.RedirectAction.MOVED_PERMANENTLY,
    301: rc.RedirectAction.MOVED_PERMANENTLY,
    302: rc.RedirectAction.FOUND,
    303: rc.RedirectAction.SEE_OTHER,
    307: rc.RedirectAction.TEMPORARY_REDIRECT,
    308: rc.RedirectAction.PERMANENT_REDIRECT,
}
#: HTTPRedirect.RedirectPortSelection numbers.
_FROM_REQUEST_PORT = 1

LookupService = Callable[[str], Service | None]


def _header_options(headers: Any, append: bool) -> tuple[list[Any], str]:
    authority = ""
    out = []
    for key in sorted(headers):
        value = headers[key]
        if key.lower() in (":authority", "host"):
            authority = value
        if key.startswith(":") or key.lower() == "host":
            continue
        action = (
            base_pb2.HeaderValueOption.APPEND_IF_EXISTS_OR_ADD
            if append
            else base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD
        )
        out.append(
            base_pb2.HeaderValueOption(
                header=base_pb2.HeaderValue(key=key, value=value), append_action=action
            )
        )
    return out, authority


def _headers_operations(headers: Any) -> tuple[list[Any], list[str], list[Any], list[str], str]:
    """(request add, request remove, response add, response remove, authority)."""
    req_set, set_authority = _header_options(headers.request.set, False)
    req_add, add_authority = _header_options(headers.request.add, True)
    resp_set, _ = _header_options(headers.response.set, False)
    resp_add, _ = _header_options(headers.response.add, True)

    def keep(keys: Any) -> list[str]:
        return [k for k in keys if not (k.startswith(":") or k.lower() == "host")]

    return (
        req_set + req_add,
        keep(headers.request.remove),
        resp_set + resp_add,
        keep(headers.response.remove),
        set_authority or add_authority,
    )


def _fraction(percent: float) -> Any:
    return percent_pb2.FractionalPercent(
        numerator=int(percent * 10000), denominator=percent_pb2.FractionalPercent.MILLION
    )


def _hundredths(percent: int) -> Any:
    return percent_pb2.FractionalPercent(numerator=percent, denominator=percent_pb2.FractionalPercent.HUNDRED)


def fault_filter_config(fault: Any) -> Any | None:
    out = fault_pb2.HTTPFault()
    has_delay = has_abort = False
    if fault.HasField("delay"):
        delay = fault.delay
        if delay.HasField("fixed_delay"):
            has_delay = True
            out.delay.fixed_delay.CopyFrom(delay.fixed_delay)
            if delay.HasField("percentage"):
                out.delay.percentage.CopyFrom(_fraction(delay.percentage.value))
            else:
                out.delay.percentage.CopyFrom(_hundredths(delay.percent))
    if fault.HasField("abort"):
        abort = fault.abort
        which = abort.WhichOneof("error_type")
        if which == "http_status":
            has_abort = True
            out.abort.http_status = abort.http_status
        elif which == "grpc_status":
            has_abort = True
            out.abort.grpc_status = _GRPC_CODES.get(abort.grpc_status, 2)
        if has_abort and abort.HasField("percentage"):
            out.abort.percentage.CopyFrom(_fraction(abort.percentage.value))
    if not (has_delay or has_abort):
        return None
    if not has_delay:
        out.ClearField("delay")
    return out


def cors_policy(policy: Any) -> Any:
    out = cors_pb2.CorsPolicy()
    # CorsPolicy.UnmatchedPreflights: IGNORE (2) stops forwarding unmatched preflights.
    out.forward_not_matching_preflights.CopyFrom(boolean(policy.unmatched_preflights != 2))
    if policy.allow_origins:
        for origin in policy.allow_origins:
            matcher = string_matcher(origin)
            if matcher is not None:
                out.allow_origin_string_match.append(matcher)
    else:
        out.allow_origin_string_match.extend(string_pb2.StringMatcher(exact=o) for o in policy.allow_origin)
    out.filter_enabled.default_value.CopyFrom(_hundredths(100))
    if policy.HasField("allow_credentials"):
        out.allow_credentials.CopyFrom(policy.allow_credentials)
    out.allow_headers = ",".join(policy.allow_headers)
    out.allow_methods = ",".join(policy.allow_methods)
    out.expose_headers = ",".join(policy.expose_headers)
    if policy.HasField("max_age"):
        out.max_age = str(policy.max_age.seconds)
    return out


def destination_cluster(
    destination: Any, service: Service | None, listener_port: int, host: str | None = None
) -> str:
    """``outbound|port|subset|host`` (istiod's GetDestinationCluster): the port is explicit, the
    service's only one, or the listener's; ``host`` is the destination's host resolved, if it was."""
    host = host or destination.host
    if service is not None and service.external_name:
        host = service.external_name
    port = listener_port
    if destination.HasField("port"):
        port = destination.port.number
    elif service is not None and len(service.ports) == 1:
        port = service.ports[0].port
    return names.outbound_cluster(port, destination.subset, host)


def _mirror_percent(route: Any) -> Any | None:
    if route.HasField("mirror_percentage"):
        return _fraction(route.mirror_percentage.value) if route.mirror_percentage.value > 0 else None
    if route.HasField("mirror_percent"):
        return _hundredths(route.mirror_percent.value) if route.mirror_percent.value > 0 else None
    return _hundredths(100)


def _mirror_policy(cluster: str, fraction: Any) -> Any:
    # Mirrored requests keep their Host: istiod turns off Envoy's "-shadow" suffix
    # (DISABLE_SHADOW_HOST_SUFFIX, on by default since Istio 1.26).
    out = rc.RouteAction.RequestMirrorPolicy(
        cluster=cluster, trace_sampled=boolean(False), disable_shadow_host_suffix_append=True
    )
    out.runtime_fraction.default_value.CopyFrom(fraction)
    return out


def _operation(route: Any, vs_name: str, port: int) -> str:
    match = route.match
    which = match.WhichOneof("path_specifier")
    path = {"prefix": match.prefix + "*", "path": match.path, "safe_regex": match.safe_regex.regex}.get(
        which or "", "/*"
    )
    cluster = route.route.cluster if route.WhichOneof("action") == "route" else ""
    parsed = names.parse_cluster(cluster) if cluster else None
    if parsed is not None:
        return f"{parsed[3]}:{parsed[1]}{path}"
    return f"{vs_name}:{port}{path}"


def _source_matches(match: Any | None, proxy: Proxy, vs: Config, gateway: GatewayRef | None) -> bool:
    """Whether a match applies where the routes are built: for sidecars (``gateway`` None, the
    ``mesh`` gateway) or on one gateway; a match that names gateways ignores source labels."""
    if match is None:
        return True
    if match.gateways:
        return gateway_match(match.gateways, vs.namespace, gateway)
    if not selector_matches(match.source_labels, proxy.labels):
        return False
    return not match.source_namespace or match.source_namespace == proxy.metadata.namespace


def translate_route(
    proxy: Proxy,
    http: Any,
    match: Any | None,
    listener_port: int,
    vs: Config,
    lookup: LookupService,
    mesh: Any,
    domain_suffix: str,
    lookup_hash: LookupHash = no_hash,
    gateway: GatewayRef | None = None,
) -> Any | None:
    """One Envoy route for one HTTPRoute and one of its matches; None if it does not apply here."""
    if match is not None and match.port and match.port != listener_port:
        return None
    if not _source_matches(match, proxy, vs, gateway):
        return None
    name = http.name
    if match is not None and match.name:
        name = f"{name}.{match.name}"
    out = rc.Route(name=name, match=route_match(match))
    out.metadata.filter_metadata["istio"].update(
        {"config": f"/apis/networking.istio.io/v1/namespaces/{vs.namespace}/virtual-service/{vs.name}"}
    )
    if match is not None and match.stat_prefix:
        out.stat_prefix = match.stat_prefix
    authority = ""
    if http.HasField("headers"):
        req_add, req_remove, resp_add, resp_remove, authority = _headers_operations(http.headers)
        out.request_headers_to_add.extend(req_add)
        out.request_headers_to_remove.extend(req_remove)
        out.response_headers_to_add.extend(resp_add)
        out.response_headers_to_remove.extend(resp_remove)

    def resolve(host: str) -> str:
        return resolve_short_name(host, vs.namespace, domain_suffix)

    if http.HasField("redirect"):
        if not _apply_redirect(out, http.redirect, listener_port):
            return None
    elif http.HasField("direct_response"):
        out.direct_response.status = http.direct_response.status
        body = http.direct_response.body
        if http.direct_response.HasField("body"):
            if body.WhichOneof("specifier") == "string":
                out.direct_response.body.inline_string = body.string
            elif body.WhichOneof("specifier") == "bytes":
                out.direct_response.body.inline_bytes = body.bytes
    else:
        _apply_destinations(out, proxy, http, listener_port, lookup, resolve, mesh, authority, lookup_hash)
    out.decorator.operation = _operation(out, vs.name, listener_port)
    if http.HasField("fault"):
        config = fault_filter_config(http.fault)
        if config is not None:
            out.typed_per_filter_config["envoy.filters.http.fault"].CopyFrom(pack(config))
    if http.HasField("cors_policy"):
        out.typed_per_filter_config["envoy.filters.http.cors"].CopyFrom(pack(cors_policy(http.cors_policy)))
    return out


def _apply_redirect(out: Any, redirect: Any, port: int) -> bool:
    code = _REDIRECT_CODES.get(redirect.redirect_code)
    if code is None:
        return False
    action = out.redirect
    action.host_redirect = redirect.authority
    action.path_redirect = redirect.uri
    if redirect.scheme:
        action.scheme_redirect = redirect.scheme
    which = redirect.WhichOneof("redirect_port")
    if which is not None:
        if which == "derive_port":
            if redirect.derive_port == _FROM_REQUEST_PORT:
                action.port_redirect = port
        else:
            action.port_redirect = redirect.port
        scheme = redirect.scheme or "http"
        if (action.port_redirect, scheme) in ((80, "http"), (443, "https")):
            action.port_redirect = 0
    action.response_code = code
    return True


def _apply_destinations(
    out: Any,
    proxy: Proxy,
    http: Any,
    port: int,
    lookup: LookupService,
    resolve: Callable[[str], str],
    mesh: Any,
    authority: str,
    lookup_hash: LookupHash,
) -> None:
    action = out.route
    timeout = http.timeout if http.HasField("timeout") else duration(0)
    action.timeout.CopyFrom(timeout)
    action.max_grpc_timeout.CopyFrom(timeout)
    if http.HasField("rewrite"):
        rewrite = http.rewrite
        if rewrite.HasField("uri_regex_rewrite"):
            action.regex_rewrite.pattern.regex = rewrite.uri_regex_rewrite.match
            action.regex_rewrite.substitution = rewrite.uri_regex_rewrite.rewrite
        elif rewrite.uri:
            action.prefix_rewrite = rewrite.uri
        if rewrite.authority:
            authority = rewrite.authority
    if authority:
        action.host_rewrite_literal = authority

    def cluster_for(destination: Any) -> str:
        host = resolve(destination.host)
        return destination_cluster(destination, lookup(host), port, host)

    if http.HasField("mirror"):
        fraction = _mirror_percent(http)
        if fraction is not None:
            action.request_mirror_policies.append(_mirror_policy(cluster_for(http.mirror), fraction))
    for mirror in http.mirrors:
        if not mirror.HasField("destination"):
            continue
        fraction = _fraction(mirror.percentage.value) if mirror.HasField("percentage") else _hundredths(100)
        if mirror.HasField("percentage") and mirror.percentage.value <= 0:
            continue
        action.request_mirror_policies.append(_mirror_policy(cluster_for(mirror.destination), fraction))

    def add_hash(dst: Any) -> bool:
        policy = hash_policy(lookup_hash(dst))
        if policy is not None:
            action.hash_policy.append(policy)
        return policy is not None

    consistent_hash = False
    if len(http.route) == 1:
        dst = http.route[0]
        action.cluster = cluster_for(dst.destination)
        consistent_hash = add_hash(dst)
        if dst.HasField("headers"):
            req_add, req_remove, resp_add, resp_remove, dst_authority = _headers_operations(dst.headers)
            out.request_headers_to_add.extend(req_add)
            out.request_headers_to_remove.extend(req_remove)
            out.response_headers_to_add.extend(resp_add)
            out.response_headers_to_remove.extend(resp_remove)
            if dst_authority and not action.host_rewrite_literal:
                action.host_rewrite_literal = dst_authority
    else:
        for dst in http.route:
            if dst.weight == 0:
                continue
            weighted = action.weighted_clusters.clusters.add(
                name=cluster_for(dst.destination), weight=uint32(dst.weight)
            )
            if dst.HasField("headers"):
                req_add, req_remove, resp_add, resp_remove, dst_authority = _headers_operations(dst.headers)
                weighted.request_headers_to_add.extend(req_add)
                weighted.request_headers_to_remove.extend(req_remove)
                weighted.response_headers_to_add.extend(resp_add)
                weighted.response_headers_to_remove.extend(resp_remove)
                if dst_authority:
                    weighted.host_rewrite_literal = dst_authority
            add_hash(dst)
    retries = (
        http.retries
        if http.HasField("retries")
        else (mesh.default_http_retry_policy if mesh.HasField("default_http_retry_policy") else None)
    )
    policy = retry_policy(retries, consistent_hash=consistent_hash)
    if policy is not None:
        action.retry_policy.CopyFrom(policy)


def routes_for_virtual_service(
    proxy: Proxy,
    vs: Config,
    listener_port: int,
    lookup: LookupService,
    mesh: Any,
    domain_suffix: str,
    lookup_hash: LookupHash = no_hash,
    gateway: GatewayRef | None = None,
) -> list[Any]:
    """Envoy routes of a VirtualService's HTTP section for one listener port, up to the first catch-all.

    ``gateway``: the routes are for that gateway's server, not for sidecars.
    """
    out: list[Any] = []
    for http in vs.spec.http:
        if not http.match:
            route = translate_route(
                proxy, http, None, listener_port, vs, lookup, mesh, domain_suffix, lookup_hash, gateway
            )
            if route is not None:
                out.append(route)
            break
        stop = False
        for match in http.match:
            route = translate_route(
                proxy, http, match, listener_port, vs, lookup, mesh, domain_suffix, lookup_hash, gateway
            )
            if route is not None:
                out.append(route)
                if is_catch_all(route):
                    stop = True
                    break
        if stop:
            break
    return out
