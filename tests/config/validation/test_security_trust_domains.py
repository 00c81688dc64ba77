"""AuthorizationPolicy ``from.source.trustDomains``: accepted alone, values checked as istiod checks them."""

from __future__ import annotations

from typing import Any

from meshpilot.config.decode import decode_object


def _policy(source: dict[str, Any], action: str = "ALLOW") -> dict[str, Any]:
    return {
        "apiVersion": "security.istio.io/v1",
        "kind": "AuthorizationPolicy",
        "metadata": {"name": "p", "namespace": "default"},
        "spec": {"action": action, "rules": [{"from": [{"source": source}]}]},
    }


def _errors(doc: dict[str, Any]) -> str:
    try:
        decode_object(doc)
    except Exception as err:  # the decoder raises ConfigError with every problem
        return str(err)
    return ""


def test_trust_domains_alone_are_a_source() -> None:
    assert _errors(_policy({"trustDomains": ["cluster.local"]})) == ""
    assert _errors(_policy({"notTrustDomains": ["*.example.com"]})) == ""


def test_bad_trust_domain_values_are_refused() -> None:
    assert "must not contain '/'" in _errors(_policy({"trustDomains": ["a/b"]}))
    assert "at most one wildcard" in _errors(_policy({"trustDomains": ["*a*"]}))
    assert "empty value not allowed" in _errors(_policy({"trustDomains": [""]}))
