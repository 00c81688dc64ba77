"""What the debug pages leave out: secrets (``/debug/configz``, ``/debug/adsz``; the config dump
hides its own, ``xds.config_dump``) and node metadata beyond istiod's fields (``/debug/adsz``).

What counts as a secret is one rule for every debug view: ``xds.redaction``.
"""

from __future__ import annotations

from typing import Any

from meshpilot.xds.redaction import REDACTED, redact

__all__ = ["ADSZ_METADATA_KEYS", "REDACTED", "adsz_metadata", "redact"]

#: The node metadata keys istiod's ``/debug/adsz`` shows (its NodeMetadata fields; the raw map is
#: not serialized). Anything else a proxy put in its metadata stays out of the page.
ADSZ_METADATA_KEYS = frozenset(
    {
        "NAMESPACE",
        "LABELS",
        "ANNOTATIONS",
        "ISTIO_VERSION",
        "CLUSTER_ID",
        "INTERCEPTION_MODE",
        "INSTANCE_IPS",
        "NODE_NAME",
        "WORKLOAD_NAME",
        "SERVICE_ACCOUNT",
        "NETWORK",
        "MESH_ID",
        "GENERATOR",
        "POD_PORTS",
        "UNPRIVILEGED_POD",
        "OWNER",
        "PLATFORM_METADATA",
        "PROXY_CONFIG",
        "ENVOY_PROMETHEUS_PORT",
        "ENVOY_STATUS_PORT",
        "STS_PORT",
        "DNS_CAPTURE",
        "DNS_AUTO_ALLOCATE",
        "ENABLE_HBONE",
        "REQUESTED_NETWORK_VIEW",
        "AUTO_REGISTER_GROUP",
        "APP_CONTAINERS",
        "INSTANCE_NAME",
        "EXIT_ON_ZERO_ACTIVE_CONNECTIONS",
        "HTTP10",
    }
)


def adsz_metadata(raw: dict[str, Any]) -> dict[str, Any]:
    """The node metadata ``/debug/adsz`` shows: istiod's fields only, secrets redacted."""
    shown: dict[str, Any] = redact({k: v for k, v in raw.items() if k in ADSZ_METADATA_KEYS})
    return shown
