"""Metric label values taken from what clients send, mapped onto known, bounded sets.

Every distinct label value is a time series kept for the life of the process.
A client that chooses label values (type URLs in NACKs, a node's
ISTIO_VERSION, an AdmissionReview's ``request.resource``) could otherwise
grow ``/metrics`` without bound; here each such value becomes one of a known
set, or ``other`` / ``unknown``.
"""

from __future__ import annotations

import re
from collections import Counter

from meshpilot.config.schemas import SCHEMAS
from meshpilot.xds.types import parse_type_url

OTHER = "other"
UNKNOWN = "unknown"


def xds_type(type_url: str) -> str:
    """An xDS type's short name (``cds``, ``eds``, ...) if it is a type meshpilot knows, else ``other``."""
    known = parse_type_url(type_url)
    return known.short if known is not None else OTHER


#: ``major.minor`` or ``major.minor.patch`` at the start of ISTIO_VERSION; suffixes such as
#: ``-dev`` or ``-distroless`` are dropped (they name a build, not a version).
_VERSION = re.compile(r"\A(\d{1,3}\.\d{1,3}(?:\.\d{1,3})?)(?![\d])")
#: Distinct versions labelled at once; proxies of a mesh run a few (an upgrade has two or three).
MAX_VERSIONS = 32


class ProxyVersions:
    """``pilot_xds{version}`` labels: a version by pattern, else ``unknown``; past MAX_VERSIONS
    distinct versions connected at once, ``other``. ``acquire`` when a proxy connects and
    ``release`` its label when it leaves, so that a version nobody runs frees its place."""

    def __init__(self, limit: int = MAX_VERSIONS) -> None:
        self._limit = limit
        self._connected: Counter[str] = Counter()

    def acquire(self, istio_version: str) -> str:
        match = _VERSION.match(istio_version)
        label = match.group(1) if match else UNKNOWN
        if label not in self._connected and label != UNKNOWN and self._distinct() >= self._limit:
            label = OTHER
        self._connected[label] += 1
        return label

    def _distinct(self) -> int:
        return len(self._connected) - (UNKNOWN in self._connected) - (OTHER in self._connected)

    def release(self, label: str) -> bool:
        """Forget one proxy of ``label``; True when none is left (its series can go)."""
        self._connected[label] -= 1
        if self._connected[label] > 0:
            return False
        del self._connected[label]
        return True


#: (group, version, plural) of every Istio kind, as ``request.resource`` names them.
_ISTIO_RESOURCES = {
    (s.group, version, s.plural) for s in SCHEMAS.values() if s.kind.is_istio for version in s.versions
}
_ISTIO_GROUPS = {group for group, _, _ in _ISTIO_RESOURCES}
_VERSIONS_OF = {(group, version) for group, version, _ in _ISTIO_RESOURCES}
_PLURALS_OF = {(group, plural) for group, _, plural in _ISTIO_RESOURCES}


def admission_resource(group: str, version: str, resource: str) -> tuple[str, str, str]:
    """``galley_validation_*{group, version, resource}``: each part as sent if Istio has it, else
    ``other`` (the API server sends only registered resources; anyone else may send anything)."""
    if group not in _ISTIO_GROUPS:
        return OTHER, OTHER, OTHER
    return (
        group,
        version if (group, version) in _VERSIONS_OF else OTHER,
        resource if (group, resource) in _PLURALS_OF else OTHER,
    )
