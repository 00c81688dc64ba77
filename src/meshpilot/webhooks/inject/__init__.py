"""Sidecar injection: istiod's ``/inject`` mutation as pure functions (see docs/architecture.md)."""
