"""Just enough protobuf wire parsing for the simulator: top-level response fields and resource names.

Parsing whole responses into protobuf objects would make the simulator,
not the server, the bottleneck.
"""

from __future__ import annotations


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7


def scan_response(data: bytes) -> tuple[str, str, str, list[tuple[int, int]]]:
    """(version, type_url, nonce, [(start, end) of each resource]) of a DiscoveryResponse."""
    version = type_url = nonce = ""
    resources: list[tuple[int, int]] = []
    pos, end = 0, len(data)
    while pos < end:
        tag, pos = _varint(data, pos)
        wire_type = tag & 7
        if wire_type == 2:
            length, pos = _varint(data, pos)
            field = tag >> 3
            if field == 2:
                resources.append((pos, pos + length))
            elif field == 1:
                version = data[pos : pos + length].decode()
            elif field == 4:
                type_url = data[pos : pos + length].decode()
            elif field == 5:
                nonce = data[pos : pos + length].decode()
            pos += length
        elif wire_type == 0:
            _, pos = _varint(data, pos)
        else:
            raise ValueError(f"unexpected wire type {wire_type}")
    return version, type_url, nonce, resources


def resource_name(data: bytes, span: tuple[int, int]) -> str:
    """Field 1 (name / cluster_name) of the message inside an ``Any`` at ``span``."""
    pos, end = span
    while pos < end:
        tag, pos = _varint(data, pos)
        length, pos = _varint(data, pos)
        if tag >> 3 == 2:  # Any.value
            inner_end = pos + length
            while pos < inner_end:
                inner_tag, pos = _varint(data, pos)
                if inner_tag & 7 == 2:
                    inner_len, pos = _varint(data, pos)
                    if inner_tag >> 3 == 1:
                        return data[pos : pos + inner_len].decode()
                    pos += inner_len
                elif inner_tag & 7 == 0:
                    _, pos = _varint(data, pos)
                else:
                    return ""
            return ""
        pos += length
    return ""


def scan_delta_response(data: bytes) -> tuple[str, str, list[tuple[int, int]], list[str]]:
    """(type_url, nonce, [(start, end) of each Resource], removed names) of a DeltaDiscoveryResponse.

    Removed names come from ``removed_resources`` (6) and ``removed_resource_names`` (8, a
    ResourceName whose field 1 is the name); ``system_version_info`` (1) is skipped.
    """
    type_url = nonce = ""
    resources: list[tuple[int, int]] = []
    removed: list[str] = []
    pos, end = 0, len(data)
    while pos < end:
        tag, pos = _varint(data, pos)
        wire_type = tag & 7
        if wire_type == 2:
            length, pos = _varint(data, pos)
            field = tag >> 3
            if field == 2:
                resources.append((pos, pos + length))
            elif field == 4:
                type_url = data[pos : pos + length].decode()
            elif field == 5:
                nonce = data[pos : pos + length].decode()
            elif field == 6:
                removed.append(data[pos : pos + length].decode())
            elif field == 8:
                removed.append(_first_string(data, pos, pos + length))
            pos += length
        elif wire_type == 0:
            _, pos = _varint(data, pos)
        else:
            raise ValueError(f"unexpected wire type {wire_type}")
    return type_url, nonce, resources, removed


def delta_resource(data: bytes, span: tuple[int, int]) -> tuple[str, str, tuple[int, int]]:
    """(name, version, span of the ``Any``) of the delta ``Resource`` at ``span``.

    The name is field 3, or the name inside ``resource_name`` (8) when a server sends only that.
    """
    name = version = ""
    resource = (0, 0)
    pos, end = span
    while pos < end:
        tag, pos = _varint(data, pos)
        if tag & 7 != 2:
            if tag & 7 != 0:
                raise ValueError(f"unexpected wire type {tag & 7}")
            _, pos = _varint(data, pos)
            continue
        length, pos = _varint(data, pos)
        field = tag >> 3
        if field == 3:
            name = data[pos : pos + length].decode()
        elif field == 1:
            version = data[pos : pos + length].decode()
        elif field == 2:
            resource = (pos, pos + length)
        elif field == 8 and not name:
            name = _first_string(data, pos, pos + length)
        pos += length
    return name, version, resource


def _first_string(data: bytes, pos: int, end: int) -> str:
    """Field 1 of the message between ``pos`` and ``end``, as a string ("" if absent)."""
    for field, start, stop in _length_delimited(data, pos, end):
        if field == 1:
            return data[start:stop].decode()
    return ""


def _length_delimited(data: bytes, pos: int, end: int) -> list[tuple[int, int, int]]:
    """(field, start, end) of every length-delimited field of the message between ``pos`` and ``end``."""
    out = []
    while pos < end:
        tag, pos = _varint(data, pos)
        wire_type = tag & 7
        if wire_type == 2:
            length, pos = _varint(data, pos)
            out.append((tag >> 3, pos, pos + length))
            pos += length
        elif wire_type == 0:
            _, pos = _varint(data, pos)
        elif wire_type == 1:
            pos += 8
        elif wire_type == 5:
            pos += 4
        else:
            raise ValueError(f"unexpected wire type {wire_type}")
    return out


_HCM = b"envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"


def listener_route_names(data: bytes, any_span: tuple[int, int]) -> list[str]:
    """The RDS route names of the Listener in the ``Any`` at ``any_span``: for each filter chain (3,
    and the default one, 25), each filter (3) whose typed_config (4) is an HttpConnectionManager, its
    ``rds`` (3) ``route_config_name`` (2). Inline route configurations (4) name no RDS resource."""
    start, end = any_span
    if data.find(_HCM, start, end) < 0:
        return []  # TCP listeners: no connection manager, nothing to parse
    names: list[str] = []
    for field, value_start, value_end in _length_delimited(data, start, end):
        if field != 2:  # Any.value: the Listener
            continue
        for chain_field, chain_start, chain_end in _length_delimited(data, value_start, value_end):
            if chain_field not in (3, 25):
                continue
            for filter_field, f_start, f_end in _length_delimited(data, chain_start, chain_end):
                if filter_field == 3:
                    names += _hcm_route_names(data, f_start, f_end)
    return names


def _hcm_route_names(data: bytes, start: int, end: int) -> list[str]:
    """The RDS name of the network filter between ``start`` and ``end``, if it is a connection manager."""
    for field, config_start, config_end in _length_delimited(data, start, end):
        if field != 4:  # Filter.typed_config
            continue
        parts = _length_delimited(data, config_start, config_end)
        if not any(f == 1 and data[s:e].endswith(_HCM) for f, s, e in parts):
            return []
        for any_field, hcm_start, hcm_end in parts:
            if any_field != 2:
                continue
            for hcm_field, rds_start, rds_end in _length_delimited(data, hcm_start, hcm_end):
                if hcm_field == 3:  # rds
                    for rds_field, s, e in _length_delimited(data, rds_start, rds_end):
                        if rds_field == 2:
                            return [data[s:e].decode()]
    return []
