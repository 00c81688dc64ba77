"""The DeltaDiscoveryResponse, written around already-serialized ``Any`` resources.

Resources are generated serialized (shared by many proxies); parsing them
into messages only to serialize them again would cost more than the rest of
a push. The field numbers are those of envoy.service.discovery.v3.
"""

from __future__ import annotations

from collections.abc import Iterable

from meshpilot.networking.wire_py import varint
from meshpilot.xds.delta_protocol import Changes, version_text
from meshpilot.xds.generators.base import Resource

# DeltaDiscoveryResponse: system_version_info 1, resources 2, type_url 4, nonce 5, removed_resources 6.
# Resource: version 1, resource 2 (Any), name 3.
_TAG_VERSION, _TAG_RESOURCES, _TAG_TYPE = b"\x0a", b"\x12", b"\x22"
_TAG_NONCE, _TAG_REMOVED = b"\x2a", b"\x32"
_TAG_RES_VERSION, _TAG_RES_ANY, _TAG_RES_NAME = b"\x0a", b"\x12", b"\x1a"


def _field(tag: bytes, payload: bytes) -> Iterable[bytes]:
    return (tag, varint(len(payload)), payload)


def _prefix(resource: Resource, version: int) -> bytes:
    """Everything of the resource's ``resources`` entry before its payload bytes, kept on the (shared,
    immutable) resource: its version is its payload's hash, so the prefix never changes for that
    object. Only the prefix is kept: the payload is not held twice."""
    prefix = resource.delta_prefix
    if prefix is None:
        head = b"".join(
            [
                *_field(_TAG_RES_NAME, resource.name.encode()),
                *_field(_TAG_RES_VERSION, version_text(version).encode()),
                _TAG_RES_ANY,
                varint(len(resource.payload)),
            ]
        )
        prefix = _TAG_RESOURCES + varint(len(head) + len(resource.payload)) + head
        object.__setattr__(resource, "delta_prefix", prefix)  # a cache on a frozen object
    return prefix


def delta_response(system_version: str, type_url: str, nonce: str, changes: Changes) -> bytes:
    parts: list[bytes] = [*_field(_TAG_VERSION, system_version.encode())]
    for resource, version in changes.updated:
        parts.append(_prefix(resource, version))
        parts.append(resource.payload)
    parts.extend(_field(_TAG_TYPE, type_url.encode()))
    parts.extend(_field(_TAG_NONCE, nonce.encode()))
    for name in changes.removed:
        parts.extend(_field(_TAG_REMOVED, name.encode()))
    return b"".join(parts)
