"""What the debug pages leave out: secrets (``/debug/configz``, ``/debug/config_dump``) and node
metadata beyond istiod's fields (``/debug/adsz``).

Config can carry key material: an EnvoyFilter may inline a private key into a
listener's TLS context, an annotation may hold a token, and
``kubectl.kubernetes.io/last-applied-configuration`` repeats the whole object
as text. Envoy's own config dump hides fields it marks sensitive; here the
rule is by name and by content, so it also covers free-form values.
"""

from __future__ import annotations

import re
from typing import Any

REDACTED = "[redacted]"

#: Endings of field and annotation names whose values are secrets (Envoy's sensitive TLS fields,
#: the usual credential names), compared without case, ``_``, ``-`` or ``.``: ``private_key``,
#: ``hmac_secret``, ``example.com/api-token``; not ``token_bucket`` or ``credentialName``.
_SENSITIVE_ENDINGS = ("privatekey", "password", "passphrase", "token", "secret", "apikey")
#: PEM private keys of any algorithm, wherever they appear in a string.
_PRIVATE_KEY = re.compile(r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----")


def _sensitive(name: str) -> bool:
    return name.lower().replace("_", "").replace("-", "").replace(".", "").endswith(_SENSITIVE_ENDINGS)


def redact(value: Any) -> Any:
    """A copy of decoded JSON with secret values replaced by ``[redacted]``: values under sensitive
    names (a TLS ``private_key``, an annotation ``…token``) and any string holding a PEM private key.
    ``credentialName`` only names a Secret, so it stays."""
    if isinstance(value, dict):
        return {key: REDACTED if _sensitive(str(key)) else redact(item) for key, item in value.items()}
    if isinstance(value, list):
        return [redact(item) for item in value]
    if isinstance(value, str) and _PRIVATE_KEY.search(value):
        return REDACTED
    return value


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
