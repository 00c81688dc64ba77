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
  ``Struct``: fields 1 (map of ``Value``); ``Value``: string_value 3, bool_value 4,
  struct_value 5, list_value 6 (``ListValue``: values 1).
- ``Cluster`` (outbound EDS clusters only): a template of every field shared by a
  class of clusters, then name 1, eds_cluster_config 3 ``{service_name 2}``, metadata 25,
  transport_socket 24, alt_stat_name 28, transport_socket_matches 43
  ``{name 1, match 2, transport_socket 3}``. A parser merges a message field that
  appears twice, so the template's ``eds_cluster_config.eds_config`` and the
  appended ``service_name`` make one ``eds_cluster_config``.
- ``TransportSocket``: name 1, typed_config 3 (``Any``). ``UpstreamTlsContext``:
  common_tls_context 1 (its fields up to 6 passed in serialized, then
  combined_validation_context 8 ``{default_validation_context 1
  {match_typed_subject_alt_names 15 {san_type 1, matcher 2 {exact 1}}}, the rest
  passed in}``), sni 2.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from meshpilot.model.endpoint import TLS_MODE_ISTIO, Endpoint, HealthStatus

#: DestinationRule ClientTLSSettings.TLSmode ISTIO_MUTUAL; -1 means "no rule sets a mode".
TLS_ISTIO_MUTUAL = 3
NO_TLS_MODE = -1

#: How an outbound cluster carries its mTLS: not at all, by endpoint tlsMode match (auto
#: mTLS), or on every connection (a DestinationRule's ISTIO_MUTUAL).
CLUSTER_TLS_NONE = 0
CLUSTER_TLS_AUTO = 1
CLUSTER_TLS_ALWAYS = 2

_MAX_UINT32 = 0xFFFFFFFF
_UNIX = "unix://"
_CLUSTER_TYPE = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
_UPSTREAM_TLS_TYPE = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext"
_RAW_BUFFER_TYPE = "type.googleapis.com/envoy.extensions.transport_sockets.raw_buffer.v3.RawBuffer"


def read_varint(data: bytes, pos: int) -> tuple[int, int]:
    """The varint at ``pos`` and the position after it; ValueError if truncated or over 64 bits."""
    value = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise ValueError("truncated or overlong varint")
        byte = data[pos]
        pos += 1
        if shift == 63 and byte & 0x7F > 1:
            raise ValueError("varint overflows 64 bits")
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


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
        by_locality.setdefault(label, []).append(lb_endpoint(ep, mtls))
        weights[label] = min(_MAX_UINT32, weights.get(label, 0) + (ep.weight or 1))
    return b"".join(
        locality_group(label, by_locality[label], weights[label]) for label in sorted(by_locality)
    )


def locality_group(label: str, lb_endpoints: Iterable[bytes], weight: int, priority: int = 0) -> bytes:
    """One ``LocalityLbEndpoints`` (field 2 of a CLA) of encoded ``LbEndpoint`` messages.

    Python only (the compiled module inlines it): the per-proxy locality path calls it too. A weight
    of 0 is left out, as istiod leaves it on a locality whose endpoints were all filtered away.
    """
    body = b"".join(_len(2, ep) for ep in lb_endpoints)
    weighted = _len(3, _uint(1, weight)) if weight else b""
    return _len(2, _locality(label) + body + weighted + _uint(5, priority))


def assignment(cluster_name: str, groups: Iterable[bytes]) -> bytes:
    """A serialized ClusterLoadAssignment of encoded ``LocalityLbEndpoints`` (locality_group)."""
    return _str(1, cluster_name) + b"".join(groups)


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


def _struct_entry(key: str, value: bytes) -> bytes:
    """One ``Struct.fields`` map entry around an encoded ``Value``."""
    return _len(1, _str(1, key) + _len(2, value))


def cluster_metadata(config: str, subset: str, host: str, name: str, namespace: str, external: bool) -> bytes:
    """A cluster's ``Metadata``: ``istio`` with config, subset, external when so, and services."""
    fields = b""
    if config:
        fields += _struct_entry("config", _str(3, config))
    if subset:
        fields += _struct_entry("subset", _str(3, subset))
    if external:
        fields += _struct_entry("external", _uint(4, 1))
    # Every outbound cluster names its service, mesh-external ones too (istiod's telemetry metadata).
    service = _struct_entry("host", _str(3, host))
    service += _struct_entry("name", _str(3, name))
    service += _struct_entry("namespace", _str(3, namespace))
    fields += _struct_entry("services", _len(6, _len(1, _len(5, service))))
    return _len(1, _str(1, "istio") + _len(2, fields))


def _validation(sans: Sequence[str], rest: bytes) -> bytes:
    """``combined_validation_context``: exact URI SAN matchers, then the shared rest."""
    # SubjectAltNameMatcher{san_type URI (3), matcher{exact}}; exact is a oneof member, so "" is written.
    matchers = b"".join(_len(15, _uint(1, 3) + _len(2, _len(1, san.encode()))) for san in sans)
    return _len(8, _len(1, matchers) + rest)


def _tls_socket(tls: tuple[bytes, bytes], sans: Sequence[str], sni: str) -> bytes:
    context = _len(1, tls[0] + _validation(sans, tls[1])) + _str(2, sni)
    return _str(1, "envoy.transport_sockets.tls") + _len(3, any_bytes(_UPSTREAM_TLS_TYPE, context))


_RAW_BUFFER_MATCH = _len(
    43,
    _str(1, "tlsMode-disabled")
    + _len(2, b"")
    + _len(3, _str(1, "envoy.transport_sockets.raw_buffer") + _len(3, any_bytes(_RAW_BUFFER_TYPE, b""))),
)


def outbound_cluster(
    template: bytes,
    name: str,
    metadata: bytes,
    tls: int,
    tls_common: bytes,
    tls_validation: bytes,
    sans: Sequence[str],
    sni: str,
) -> bytes:
    """An outbound EDS cluster as a serialized ``Any``: the class template plus this cluster's fields.

    The TLS context is written exactly as protobuf serializes it (the bytes sit in an
    ``Any``, compared as bytes): ``tls_common`` is the CommonTlsContext without its
    combined_validation_context (field 8, its last), which is the SAN matchers then
    ``tls_validation``, the rest of that message; both are shared per ALPN.
    """
    body = template + _str(1, name) + _len(3, _str(2, name)) + _len(25, metadata)
    if tls == CLUSTER_TLS_ALWAYS:
        body += _len(24, _tls_socket((tls_common, tls_validation), sans, sni))
    body += _str(28, name + ";")
    if tls == CLUSTER_TLS_AUTO:
        match = _len(2, _struct_one_string("tlsMode", "istio"))
        body += _len(
            43,
            _str(1, "tlsMode-istio") + match + _len(3, _tls_socket((tls_common, tls_validation), sans, sni)),
        )
        body += _RAW_BUFFER_MATCH
    return any_bytes(_CLUSTER_TYPE, body)
