"""Protobuf wire encoding of xDS responses and ClusterLoadAssignments (pure-Python twin).

Building protobuf objects costs microseconds per field in Python; the
high-volume resources are encoded straight into bytes instead.
``ext/wire.pyx`` is the compiled twin. Both produce the same bytes, which
parse into exactly the messages the protobuf-object builders make (tests
check both over generated inputs).

Encodings, by field number:

- ``DiscoveryResponse``: version_info 1, resources 2 (``Any``), type_url 4, nonce 5.
- ``Any``: type_url 1, value 2.
- ``ClusterLoadAssignment``: cluster_name 1, endpoints 2 (``LocalityLbEndpoints``).
- ``LocalityLbEndpoints``: locality 1 (always present, maybe empty), lb_endpoints 2,
  load_balancing_weight 3 (``UInt32Value``).
- ``LbEndpoint``: endpoint 1, health_status 2, metadata 3, load_balancing_weight 4.
- ``Endpoint``: address 1, additional_addresses 4 (``{address 1}``).
- ``Address``: socket_address 1 ``{address 2, port_value 3}`` (port always written: it is
  a oneof member, so zero is a value) or pipe 2 ``{path 1}``.
- ``Metadata``: filter_metadata 1 (map of ``Struct``: entry ``{key 1, value 2}``);
  ``Struct``: fields 1 (map of ``Value``); ``Value``: string_value 3.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from meshpilot.model.endpoint import TLS_MODE_ISTIO, Endpoint, HealthStatus

#: DestinationRule ClientTLSSettings.TLSmode ISTIO_MUTUAL; -1 means "no rule sets a mode".
TLS_ISTIO_MUTUAL = 3
NO_TLS_MODE = -1

_MAX_UINT32 = 0xFFFFFFFF
_UNIX = "unix://"


def varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _len(field: int, payload: bytes) -> bytes:
    return varint(field << 3 | 2) + varint(len(payload)) + payload


def _str(field: int, text: str) -> bytes:
    return _len(field, text.encode()) if text else b""


def _uint(field: int, value: int) -> bytes:
    return varint(field << 3) + varint(value) if value else b""


def any_bytes(type_url: str, value: bytes) -> bytes:
    """A serialized ``google.protobuf.Any``."""
    return _str(1, type_url) + (_len(2, value) if value else b"")


def discovery_response(version: str, type_url: str, nonce: str, resources: Sequence[bytes]) -> bytes:
    """A serialized DiscoveryResponse around already-serialized ``Any`` resources."""
    return b"".join([_str(1, version), *(_len(2, r) for r in resources), _str(4, type_url), _str(5, nonce)])


def _address(address: str, port: int) -> bytes:
    if address.startswith(_UNIX):
        return _len(2, _str(1, address[len(_UNIX) :]))
    # port_value is in a oneof, so it is written even when zero (istiod always sets it).
    return _len(1, _str(2, address) + varint(3 << 3) + varint(port))


def _struct_one_string(key: str, value: str) -> bytes:
    return _len(1, _str(1, key) + _len(2, _str(3, value)))


_MTLS_METADATA = _len(
    1, _str(1, "envoy.transport_socket_match") + _len(2, _struct_one_string("tlsMode", "istio"))
)


def lb_endpoint(ep: Endpoint, mtls: bool) -> bytes:
    endpoint = _len(1, _address(ep.address, ep.port))
    for extra in ep.extra_addresses:
        endpoint += _len(4, _len(1, _address(extra, ep.port)))
    metadata = _MTLS_METADATA if mtls else b""
    metadata += _len(1, _str(1, "istio") + _len(2, _struct_one_string("workload", ep.telemetry)))
    health = int(ep.health) if ep.health is not HealthStatus.TERMINATING else int(HealthStatus.UNHEALTHY)
    return b"".join(
        (_len(1, endpoint), _uint(2, health), _len(3, metadata), _len(4, _uint(1, ep.weight or 1)))
    )


def _selected(ep: Endpoint, port_name: str, subset: Mapping[str, str] | None, allow_hostnames: bool) -> bool:
    if ep.service_port_name != port_name or ep.health is not HealthStatus.HEALTHY:
        return False
    if subset is not None:
        labels = ep.labels
        for key, value in subset.items():
            if labels.get(key) != value:
                return False
    return allow_hostnames or ep.is_ip or ep.address.startswith(_UNIX)


def select(
    endpoints: Sequence[Endpoint],
    port_name: str,
    subset: Mapping[str, str] | None,
    allow_hostnames: bool = False,
) -> list[Endpoint]:
    """The endpoints that serve ``port_name``, match the subset labels and are healthy."""
    return [ep for ep in endpoints if _selected(ep, port_name, subset, allow_hostnames)]


def _locality(label: str) -> bytes:
    parts = label.split("/") if label else []
    parts += [""] * (3 - len(parts))
    return _len(1, _str(1, parts[0]) + _str(2, parts[1]) + _str(3, parts[2]))


def locality_groups(endpoints: Sequence[Endpoint], tls_mode: int) -> bytes:
    """Repeated ``LocalityLbEndpoints`` (field 2 of a CLA), one per locality in sorted order."""
    by_locality: dict[str, list[bytes]] = {}
    weights: dict[str, int] = {}
    for ep in endpoints:
        mtls = tls_mode == TLS_ISTIO_MUTUAL if tls_mode != NO_TLS_MODE else ep.tls_mode == TLS_MODE_ISTIO
        label = ep.locality.label
        by_locality.setdefault(label, []).append(_len(2, lb_endpoint(ep, mtls)))
        weights[label] = min(_MAX_UINT32, weights.get(label, 0) + (ep.weight or 1))
    return b"".join(
        _len(2, _locality(label) + b"".join(by_locality[label]) + _len(3, _uint(1, weights[label])))
        for label in sorted(by_locality)
    )


def cluster_load_assignment(
    cluster_name: str,
    endpoints: Sequence[Endpoint],
    port_name: str,
    subset: Mapping[str, str] | None,
    tls_mode: int,
    allow_hostnames: bool = False,
) -> bytes:
    """A serialized ClusterLoadAssignment of the selected endpoints (only the name if none)."""
    chosen = select(endpoints, port_name, subset, allow_hostnames)
    return _str(1, cluster_name) + locality_groups(chosen, tls_mode)
