"""Admission webhooks served over HTTPS: validation (and, later, sidecar injection)."""
