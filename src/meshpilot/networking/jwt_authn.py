"""RequestAuthentication as Envoy's ``envoy.filters.http.jwt_authn``, as istiod builds it
(``security/authn/policy_applier.go``, in its default JWKS mode, where istiod fetches the keys).

The JWT rules of every RequestAuthentication selecting the workload are sorted by issuer; rule
``i`` becomes provider ``origins-<i>``. A request passes when each present token is valid for
some provider (a missing token is allowed: requiring one is AuthorizationPolicy's job). Keys are
always inline: the rule's ``jwks``, or the JWKS its ``jwksUri`` (or its issuer's OpenID
discovery) gave, looked up in a ``JwksLookup``. While no keys are known, as when the fetch fails,
istiod inlines a JWKS whose private key nobody has, so every token is rejected (fail closed).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from envoy.config.route.v3 import route_components_pb2
from envoy.extensions.filters.http.jwt_authn.v3 import config_pb2 as jwt_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from google.protobuf import empty_pb2

from meshpilot.model.config import Config
from meshpilot.model.jwks import JwksLookup
from meshpilot.networking.authz_matchers import JWT_FILTER, JWT_PAYLOAD
from meshpilot.networking.protobuf import pack

#: The JWKS inlined when the real one cannot be had, so every token fails (istiod does the same with a
#: key of its own): an RSA public key made for meshpilot whose private key was discarded at once.
PUBLIC_ONLY_JWKS = (
    '{\n  "keys": [\n    {\n      "kty": "RSA",\n      "e": "AQAB",\n      "n": "'
    "0IiMUMarNxdIV1HtDZWPkIK7ufKJ19oKcgv1-WtYX3tvY8OUUvrHl0MwlmHWaM3Si3gLZEm4rsGfalGiUQI-DQa4pV"
    "jLhuqOX1kJI5TEL7Auoe9zTAIkR8QG8YwUe15VOnSFmndPlLn0T3IYYkz8BuX7W6xoLAnF6wFLZK4daW6Gp9AK_mlb"
    "moXVoJCzS8meqtctB-zJn6EXWiQg9UieLF5kseTgl9JDr9M31BwK5Ppw33V4R2ChL0yGzkIB3a1mdF_IbSBUx0NVsl"
    "4HOKqavAoPtDinXt4eVqVpaWFCwE2T0vPQtuIIkSrJ8RQek0YmnjMNdBh7j6CNtZ2rOUIoAQ"
    '"\n    }\n  ]\n}'
)
_DEFAULT_SPACE_DELIMITED = ("permission", "scope")
_DEFAULT_TIMEOUT_S = 5.0


def jwt_rules(configs: Sequence[Config]) -> list[tuple[Config, Any]]:
    """Every JWT rule of ``configs`` with its RequestAuthentication, sorted by issuer."""
    rules = [(config, rule) for config in configs for rule in config.spec.jwt_rules]
    return sorted(rules, key=lambda pair: pair[1].issuer)


def _timeout_s(rule: Any) -> float:
    if rule.HasField("timeout"):
        return float(rule.timeout.seconds + rule.timeout.nanos / 1e9)
    return _DEFAULT_TIMEOUT_S


def local_jwks(config: Config, rule: Any, lookup: JwksLookup) -> str:
    """The inline JWKS a rule gets: its own, the fetched one, or the fail-closed one."""
    if rule.jwks:
        return str(rule.jwks)
    found = lookup.jwks(rule.jwks_uri, rule.issuer, _timeout_s(rule), config.key)
    return found if found is not None else PUBLIC_ONLY_JWKS


def _space_delimited(claims: Sequence[str]) -> list[str]:
    if not claims:
        return list(_DEFAULT_SPACE_DELIMITED)
    return sorted(set(claims) | set(_DEFAULT_SPACE_DELIMITED))


def _provider(rule: Any, jwks: str, *, clear_route_cache: bool) -> Any:
    provider = jwt_pb2.JwtProvider(
        issuer=rule.issuer,
        audiences=list(rule.audiences),
        forward=rule.forward_original_token,
        forward_payload_header=rule.output_payload_to_header,
        payload_in_metadata=JWT_PAYLOAD,
        clear_route_cache=clear_route_cache,
        from_params=list(rule.from_params),
        from_cookies=list(rule.from_cookies),
    )
    provider.normalize_payload_in_metadata.space_delimited_claims.extend(
        _space_delimited(rule.space_delimited_claims)
    )
    for claim in rule.output_claim_to_headers:
        provider.claim_to_headers.add(header_name=claim.header, claim_name=claim.claim)
    for header in rule.from_headers:
        provider.from_headers.add(name=header.name, value_prefix=header.prefix)
    provider.local_jwks.inline_string = jwks
    return provider


def _named(name: str) -> Any:
    return jwt_pb2.JwtRequirement(provider_name=name)


def jwt_filter(
    configs: Sequence[Config], lookup: JwksLookup, *, clear_route_cache: bool = False
) -> Any | None:
    """The jwt_authn HTTP filter for the RequestAuthentications selecting a workload, or None."""
    rules = jwt_rules(configs)
    if not rules:
        return None
    authn = jwt_pb2.JwtAuthentication(bypass_cors_preflight=True)
    optional: list[Any] = []
    for i, (config, rule) in enumerate(rules):
        name = f"origins-{i}"
        authn.providers[name].CopyFrom(
            _provider(rule, local_jwks(config, rule, lookup), clear_route_cache=clear_route_cache)
        )
        optional.append(
            jwt_pb2.JwtRequirement(
                requires_any=jwt_pb2.JwtRequirementOrList(
                    requirements=[_named(name), jwt_pb2.JwtRequirement(allow_missing=empty_pb2.Empty())]
                )
            )
        )
    if len(optional) == 1:
        requires = optional[0]
    else:
        any_of = [_named(f"origins-{i}") for i in range(len(rules))]
        any_of.append(
            jwt_pb2.JwtRequirement(requires_all=jwt_pb2.JwtRequirementAndList(requirements=optional))
        )
        requires = jwt_pb2.JwtRequirement(requires_any=jwt_pb2.JwtRequirementOrList(requirements=any_of))
    authn.rules.add(match=route_components_pb2.RouteMatch(prefix="/"), requires=requires)
    return hcm_pb2.HttpFilter(name=JWT_FILTER, typed_config=pack(authn))


def jwks_fingerprint(configs: Sequence[Config], lookup: JwksLookup) -> tuple[str, ...]:
    """The fetched keys the filter would inline: part of the cache key of what carries it."""
    return tuple(local_jwks(config, rule, lookup) for config, rule in jwt_rules(configs) if not rule.jwks)
