"""Errors raised while reading config, carrying where the problem is."""

from __future__ import annotations

from typing import Any


class ConfigError(ValueError):
    """An object that cannot be applied: unparseable, unknown, or invalid.

    ``path`` is the field path inside the object ("spec.http[0].route"), and
    the message says what is wrong there.
    """

    def __init__(self, message: str, path: str = "") -> None:
        super().__init__(f"{path}: {message}" if path else message)
        self.reason = message
        self.path = path


class ValidationError(ConfigError):
    """A well-formed object whose values istiod's validation rejects."""

    def __init__(self, errors: list[str]) -> None:
        super().__init__("; ".join(errors))
        self.errors = errors


_TYPE_NAMES = {
    dict: "an object",
    list: "a list",
    str: "a string",
    bool: "a boolean",
    int: "an integer",
    float: "a number",
    type(None): "null",
}


def type_name(value: Any) -> str:
    """How an error message names the JSON type of a value ("a string", "an object")."""
    return _TYPE_NAMES.get(type(value), type(value).__name__)
