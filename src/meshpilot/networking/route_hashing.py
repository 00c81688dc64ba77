"""Route hash policies from DestinationRule consistentHash, as istiod's route builder derives them.

The cluster gets the hashing load balancer (``traffic_policy.py``); the route
gets what Envoy hashes a request by. Which policy applies to a destination
follows istiod's HashForHTTPDestination and hashForService.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from envoy.config.route.v3 import route_components_pb2 as rc

#: The DestinationRule consistent hash for a route destination (an HTTPRouteDestination), if any.
LookupHash = Callable[[Any], Any | None]


def no_hash(_destination: Any) -> Any | None:
    return None


def hash_policy(consistent_hash: Any | None) -> Any | None:
    """A DestinationRule ``consistentHash`` as the route hash policy Envoy hashes requests by."""
    if consistent_hash is None:
        return None
    which = consistent_hash.WhichOneof("hash_key")
    if which == "http_header_name":
        return rc.RouteAction.HashPolicy(
            header=rc.RouteAction.HashPolicy.Header(header_name=consistent_hash.http_header_name)
        )
    if which == "http_cookie":
        cookie = consistent_hash.http_cookie
        out = rc.RouteAction.HashPolicy.Cookie(name=cookie.name, path=cookie.path)
        if cookie.HasField("ttl"):
            out.ttl.CopyFrom(cookie.ttl)
        for attribute in cookie.attributes:
            out.attributes.add(name=attribute.name, value=attribute.value)
        return rc.RouteAction.HashPolicy(cookie=out)
    if which == "use_source_ip":
        return rc.RouteAction.HashPolicy(
            connection_properties=rc.RouteAction.HashPolicy.ConnectionProperties(
                source_ip=consistent_hash.use_source_ip
            )
        )
    if which == "http_query_parameter_name":
        return rc.RouteAction.HashPolicy(
            query_parameter=rc.RouteAction.HashPolicy.QueryParameter(
                name=consistent_hash.http_query_parameter_name
            )
        )
    return None


def _port_consistent_hash(policy: Any, port: int) -> Any | None:
    for settings in policy.port_level_settings:
        if settings.port.number == port:
            lb = settings.load_balancer
            return lb.consistent_hash if lb.HasField("consistent_hash") else None
    return None


def _consistent_hash(policy: Any | None) -> Any | None:
    if policy is None or not policy.load_balancer.HasField("consistent_hash"):
        return None
    return policy.load_balancer.consistent_hash


def destination_consistent_hash(rule: Any | None, destination: Any) -> Any | None:
    """istiod's HashForHTTPDestination: subset port settings, subset, port settings, then the rule.

    ``rule`` is a MergedDestinationRule; port settings count only when the
    destination names its port.
    """
    if rule is None:
        return None
    policy = rule.traffic_policy
    found = _consistent_hash(policy)
    port = destination.port.number if destination.HasField("port") else 0
    port_hash = _port_consistent_hash(policy, port) if policy is not None and port else None
    subset_hash = subset_port_hash = None
    if destination.subset:
        subset = rule.subset(destination.subset)
        if subset is not None and subset.HasField("traffic_policy"):
            subset_hash = _consistent_hash(subset.traffic_policy)
            if port:
                subset_port_hash = _port_consistent_hash(subset.traffic_policy, port)
    for candidate in (subset_port_hash, subset_hash, port_hash):
        if candidate is not None:
            return candidate
    return found


def service_consistent_hash(rule: Any | None, port: int) -> Any | None:
    """istiod's hashForService: the rule's consistent hash, or its port's when that has one."""
    if rule is None:
        return None
    policy = rule.traffic_policy
    found = _consistent_hash(policy)
    if policy is not None:
        port_hash = _port_consistent_hash(policy, port)
        if port_hash is not None:
            found = port_hash
    return found
