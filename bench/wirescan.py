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
