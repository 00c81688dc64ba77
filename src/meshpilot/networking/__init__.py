"""Builders of Envoy config: pure functions of the proxy and the push context."""
