"""What counts as a secret in debug output, and hiding it: one rule for Envoy protos (the config
dump, over xDS and HTTP alike) and for decoded JSON (``/debug/configz``, ``/debug/adsz``).

Config can carry key material: an EnvoyFilter may inline a private key into a listener's or a
cluster's TLS context, an annotation may hold a token, and
``kubectl.kubernetes.io/last-applied-configuration`` repeats the whole object as text. Envoy's own
config dump hides the fields its protos mark sensitive; here the rule is by name and by content, so
it also covers free-form values:

- a value under a sensitive name (``sensitive_name``: a TLS ``private_key``, a ``password``, an
  ``hmac_secret``, an annotation ``example.com/api-token``) is hidden whole. In JSON it becomes
  ``[redacted]``. In a proto that holds for a string or bytes field, and for a field holding a
  value rather than typed config (``_VALUES``: a DataSource, a Struct): every string and bytes
  field inside becomes ``[redacted]`` (a DataSource's ``inline_bytes`` or ``inline_string``), as
  Envoy redacts a sensitive message. Typed config under such a name is read field by field
  instead: a config dump's ``secret`` is a whole SDS ``Secret``, of which only the private key
  and password are secret;
- any string or bytes value holding a PEM private key is hidden, whatever its name.

``credentialName`` and ``token_bucket`` only look alike: they stay.
"""

from __future__ import annotations

import re
from typing import Any

from google.protobuf import descriptor_pool, message_factory
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

REDACTED = "[redacted]"
_REDACTED_BYTES = REDACTED.encode()

#: Endings of field and annotation names whose values are secrets (Envoy's sensitive TLS fields,
#: the usual credential names), compared without case, ``_``, ``-`` or ``.``: ``private_key``,
#: ``hmac_secret``, ``example.com/api-token``; not ``token_bucket`` or ``credentialName``.
_SENSITIVE_ENDINGS = ("privatekey", "password", "passphrase", "token", "secret", "apikey")
#: PEM private keys of any algorithm, wherever they appear in a value.
_PRIVATE_KEY = re.compile(r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----")
_PRIVATE_KEY_BYTES = re.compile(_PRIVATE_KEY.pattern.encode())
_ANY = "google.protobuf.Any"
#: Messages that carry a value rather than typed config: under a sensitive name, hidden whole.
_VALUES = frozenset(
    {
        "envoy.config.core.v3.DataSource",
        "google.protobuf.Struct",
        "google.protobuf.Value",
        "google.protobuf.ListValue",
        "google.protobuf.StringValue",
        "google.protobuf.BytesValue",
    }
)


def sensitive_name(name: str) -> bool:
    """Whether a value named ``name`` (a field, a map key, an annotation) is a secret."""
    return name.lower().replace("_", "").replace("-", "").replace(".", "").endswith(_SENSITIVE_ENDINGS)


def holds_private_key(value: str | bytes) -> bool:
    if isinstance(value, str):
        return _PRIVATE_KEY.search(value) is not None
    return _PRIVATE_KEY_BYTES.search(value) is not None


def redact(value: Any) -> Any:
    """A copy of decoded JSON with secret values replaced by ``[redacted]``."""
    if isinstance(value, dict):
        return {key: REDACTED if sensitive_name(str(key)) else redact(item) for key, item in value.items()}
    if isinstance(value, list):
        return [redact(item) for item in value]
    if isinstance(value, str) and holds_private_key(value):
        return REDACTED
    return value


def redact_message(message: Message, *, sensitive: bool = False) -> bool:
    """Hide the secrets in ``message``, in place, looking inside every ``Any`` whose type is known;
    True if anything was hidden. ``sensitive``: all of ``message`` is under a sensitive name.

    The caller must own ``message``: a generated resource may be shared with the xDS cache.
    """
    if message.DESCRIPTOR.full_name == _ANY:
        return _redact_any(message, sensitive)
    changed = False
    for field, value in message.ListFields():
        if field.type == FieldDescriptor.TYPE_MESSAGE:
            entry = field.message_type
            if entry is not None and entry.GetOptions().map_entry:
                changed |= _redact_map(entry.fields_by_name["value"], value, sensitive)
            else:
                hide = sensitive or (_holds_a_value(field) and sensitive_name(field.name))
                for item in value if field.is_repeated else (value,):
                    changed |= redact_message(item, sensitive=hide)
        elif field.type in (FieldDescriptor.TYPE_STRING, FieldDescriptor.TYPE_BYTES):
            hide = sensitive or sensitive_name(field.name)
            if field.is_repeated:
                for i, item in enumerate(value):
                    if _hidden(item, hide):
                        value[i] = _replacement(item)
                        changed = True
            elif _hidden(value, hide):
                setattr(message, field.name, _replacement(value))
                changed = True
    return changed


def _redact_map(value_field: FieldDescriptor, entries: Any, sensitive: bool) -> bool:
    """A map field: a string key names its value (``Struct.fields``, ``filter_metadata``)."""
    changed = False
    named = value_field.type != FieldDescriptor.TYPE_MESSAGE or _holds_a_value(value_field)
    for key in list(entries):
        hide = sensitive or (named and isinstance(key, str) and sensitive_name(key))
        if value_field.type == FieldDescriptor.TYPE_MESSAGE:
            changed |= redact_message(entries[key], sensitive=hide)
        elif isinstance(entries[key], str | bytes) and _hidden(entries[key], hide):
            entries[key] = _replacement(entries[key])
            changed = True
    return changed


def _redact_any(packed: Any, sensitive: bool) -> bool:
    try:
        descriptor = descriptor_pool.Default().FindMessageTypeByName(packed.type_url.rpartition("/")[2])
    except KeyError:
        # A type this process cannot read: nothing can be kept of a value that may hold a secret.
        if packed.value and (sensitive or holds_private_key(packed.value)):
            packed.value = b""
            return True
        return False
    inner = message_factory.GetMessageClass(descriptor).FromString(packed.value)
    if not redact_message(inner, sensitive=sensitive):
        return False
    packed.value = inner.SerializeToString()
    return True


def _holds_a_value(field: FieldDescriptor) -> bool:
    return field.message_type is not None and field.message_type.full_name in _VALUES


def _hidden(value: str | bytes, sensitive: bool) -> bool:
    """Whether ``value`` must be replaced (an already redacted value need not be)."""
    return (sensitive or holds_private_key(value)) and value not in (REDACTED, _REDACTED_BYTES)


def _replacement(value: str | bytes) -> str | bytes:
    return REDACTED if isinstance(value, str) else _REDACTED_BYTES
