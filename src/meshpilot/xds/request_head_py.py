"""The head of a serialized DiscoveryRequest, read without parsing it (pure-Python twin).

Envoy ACKs every response with a request that repeats all the names it
watches: a thousand cluster names for EDS in a large mesh. Parsing that into
a message and a set of strings, for every ACK of every proxy, was the largest
cost of an endpoint push. Most ACKs change nothing, so the stream reads only
the head (type URL, nonce, version, whether a node or an error is present)
and where the names lie; when the names' bytes hash as before and the nonce
is the one sent, the ACK is recorded without a parse. Anything else takes
the full parse. ``ext/request_head.pyx`` is the compiled twin.

``scan`` returns ``(type_url, nonce, version, flags, names_start, names_end,
names_count)``. The names are the bytes of every ``resource_names`` field
(tags included) from ``names_start`` to ``names_end``; ``FLAG_FULL_PARSE``
is set when they are not one contiguous run or the request holds fields the
fast path does not read (node, error_detail, resource_locators, unknown
fields). Malformed wire data raises ValueError; the caller's full parse then
reports it.
"""

from __future__ import annotations

from meshpilot.networking.wire_py import read_varint

#: The request carries a node (the first request of a stream).
FLAG_NODE = 1
#: The request carries error_detail (a NACK).
FLAG_ERROR = 2
#: Something only a full parse can handle; never take the fast path.
FLAG_FULL_PARSE = 4

_VERSION, _NODE, _NAMES, _TYPE_URL, _NONCE, _ERROR = 1, 2, 3, 4, 5, 6


def scan(data: bytes) -> tuple[str, str, str, int, int, int, int]:
    """The head of a serialized DiscoveryRequest (see the module docstring)."""
    type_url = nonce = version = ""
    flags = 0
    names_start = names_end = -1
    names_count = 0
    pos, end = 0, len(data)
    while pos < end:
        field_start = pos
        key, pos = read_varint(data, pos)
        field, wire_type = key >> 3, key & 7
        if wire_type == 0:
            _, pos = read_varint(data, pos)
            flags |= FLAG_FULL_PARSE
            continue
        if wire_type == 1 or wire_type == 5:
            pos += 8 if wire_type == 1 else 4
            if pos > end:
                raise ValueError("truncated fixed-width field")
            flags |= FLAG_FULL_PARSE
            continue
        if wire_type != 2:
            raise ValueError(f"unsupported wire type {wire_type}")
        length, pos = read_varint(data, pos)
        if pos + length > end:
            raise ValueError("length beyond the end of the message")
        value = data[pos : pos + length]
        pos += length
        if field == _NAMES:
            if names_count and names_end != field_start:
                flags |= FLAG_FULL_PARSE  # interleaved with other fields
            if not names_count:
                names_start = field_start
            names_end = pos
            names_count += 1
        elif field == _TYPE_URL:
            type_url = value.decode()
        elif field == _NONCE:
            nonce = value.decode()
        elif field == _VERSION:
            version = value.decode()
        elif field == _NODE:
            flags |= FLAG_NODE | FLAG_FULL_PARSE
        elif field == _ERROR:
            flags |= FLAG_ERROR | FLAG_FULL_PARSE
        else:
            flags |= FLAG_FULL_PARSE
    if not names_count:
        names_start = names_end = 0
    return type_url, nonce, version, flags, names_start, names_end, names_count
