"""istiod's MERGE of a patch value into a generated message.

It is protobuf's merge (set scalars replace, messages merge field by field, lists append, map entries
replace) with one exception istiod makes: a ``Duration`` is replaced whole, so merging ``2s`` into
``10.5s`` gives ``2s``, not ``2.5s``. ``MERGE_AND_REPLACE_LIST`` differs only in that a list the
value sets replaces the generated one, at any depth.

Typed configs (``Any``) of filters and transport sockets are merged by ``merge_any``: both sides are
read as their type and merged, so a patch can change one field of a filter's config; istiod does the
same (``MergeAnyWithAny``). Two different types cannot be merged.
"""

from __future__ import annotations

from google.protobuf import any_pb2, descriptor_pool, message_factory
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from meshpilot.networking.envoyfilter.values import knows_type
from meshpilot.networking.protobuf import pack

_DURATION = "google.protobuf.Duration"


class MergeError(ValueError):
    """Two typed configs that cannot be merged."""


def merge(dst: Message, src: Message, replace_lists: bool = False) -> None:
    """Merge ``src`` into ``dst`` in place, as istiod merges a patch value."""
    for fd, value in src.ListFields():
        if fd.is_repeated:
            target = getattr(dst, fd.name)
            if fd.message_type is not None and fd.message_type.GetOptions().map_entry:
                _merge_map(target, value, fd)
                continue
            if replace_lists:
                del target[:]
            if fd.message_type is not None:
                for item in value:
                    target.add().CopyFrom(item)
            else:
                target.extend(value)
        elif fd.message_type is not None:
            sub = getattr(dst, fd.name)
            if fd.message_type.full_name == _DURATION:
                sub.CopyFrom(value)
            else:
                # Present even when the value's message is empty, as in istiod.
                sub.SetInParent()
                merge(sub, value, replace_lists)
        else:
            setattr(dst, fd.name, value)


def _merge_map(target: object, value: object, fd: FieldDescriptor) -> None:
    # A map entry the value sets replaces the generated one whole.
    entry = fd.message_type
    assert entry is not None
    value_fd = entry.fields_by_name["value"]
    for key, item in value.items():  # type: ignore[attr-defined]
        if value_fd.message_type is not None:
            target[key].CopyFrom(item)  # type: ignore[index]
        else:
            target[key] = item  # type: ignore[index]


def unpack(typed: any_pb2.Any) -> Message:
    """The message inside an ``Any``; MergeError if its type is unknown."""
    name = typed.TypeName()
    if not knows_type(name):
        raise MergeError(f"unknown type {typed.type_url}")
    descriptor = descriptor_pool.Default().FindMessageTypeByName(name)
    message: Message = message_factory.GetMessageClass(descriptor)()
    if not typed.Unpack(message):
        raise MergeError(f"cannot read {typed.type_url}")
    return message


def merge_any(dst: any_pb2.Any, src: any_pb2.Any) -> any_pb2.Any:
    """``src``'s config merged into ``dst``'s, packed again; MergeError when the types differ."""
    if dst.type_url.rpartition("/")[2] != src.type_url.rpartition("/")[2]:
        raise MergeError(f"cannot merge {src.type_url} into {dst.type_url}")
    base = unpack(dst)
    merge(base, unpack(src))
    return pack(base)  # type: ignore[no-any-return]
