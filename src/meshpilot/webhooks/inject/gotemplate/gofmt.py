"""``fmt.Sprintf`` for templates' ``printf``: Go's verbs and flags, with Go's ``%!verb(type=value)``
for a value of the wrong kind, ``%!verb(MISSING)`` and ``%!(EXTRA …)``."""

from __future__ import annotations

import re
from typing import Any

from meshpilot.config.validation.formatting import go_quote
from meshpilot.webhooks.inject.gotemplate.values import MISSING, format_float, sprint, type_name

_VERB = re.compile(r"%([-+# 0]*)(\*|\d+)?(?:\.(\*|\d+)?)?([a-zA-Z%])")


def _pad(text: str, flags: str, width: int | None) -> str:
    if width is None or len(text) >= width:
        return text
    if "-" in flags:
        return text.ljust(width)
    if "0" in flags and text[:1] in "+-" and text[1:2].isdigit():
        return text[0] + text[1:].rjust(width - 1, "0")
    if "0" in flags and (text[:1].isdigit()):
        return text.rjust(width, "0")
    return text.rjust(width)


def _bad(verb: str, value: Any) -> str:
    return f"%!{verb}({type_name(value)}={sprint(value)})"


def _integer(verb: str, flags: str, value: int) -> str:
    base = {"d": "d", "x": "x", "X": "X", "o": "o", "b": "b", "O": "o"}[verb]
    text = format(abs(value), base)
    if verb == "O":
        text = "0o" + text
    elif "#" in flags and verb in "xX":
        text = "0" + verb + text
    elif "#" in flags and verb == "o":
        text = "0" + text
    sign = "-" if value < 0 else ("+" if "+" in flags else (" " if " " in flags else ""))
    return sign + text


def format_one(verb: str, flags: str, precision: int | None, value: Any) -> str:
    """One verb applied to one argument (without padding)."""
    if verb == "v":
        if "#" in flags and isinstance(value, str):
            return go_quote(value)
        return sprint(None if value is MISSING else value)
    if verb == "T":
        return type_name(value)
    if verb == "t":
        return ("true" if value else "false") if isinstance(value, bool) else _bad(verb, value)
    if verb in "sq":
        if isinstance(value, (int, float)) and not isinstance(value, bool) and verb == "s":
            return _bad(verb, value)
        if verb == "q":
            if isinstance(value, str):
                return "`" + value + "`" if "#" in flags and "`" not in value else go_quote(value)
            if isinstance(value, int) and not isinstance(value, bool):
                return "'" + go_quote(chr(value))[1:-1].replace("'", "\\'") + "'"
            return _bad(verb, value)
        text = sprint(None if value is MISSING else value)
        return text[:precision] if precision is not None else text
    if verb in "dxXobO":
        if isinstance(value, bool):
            return _bad(verb, value)
        if isinstance(value, int):
            return _integer(verb, flags, value)
        if isinstance(value, str) and verb in "xX":
            text = value.encode().hex()
            return text.upper() if verb == "X" else text
        return _bad(verb, value)
    if verb == "c":
        if isinstance(value, int) and not isinstance(value, bool):
            return chr(value)
        return _bad(verb, value)
    if verb in "feEgG":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return _bad(verb, value)
        number = float(value)
        if verb == "f":
            text = format_float(number, "f", 6 if precision is None else precision)
        elif verb in "eE":
            text = format_float(number, "e", 6 if precision is None else precision)
        else:
            text = format_float(number, "g", -1 if precision is None else precision)
        if verb in "EG":
            text = text.upper()
        if "+" in flags and not text.startswith("-"):
            text = "+" + text
        return text
    if verb == "U":
        if isinstance(value, int) and not isinstance(value, bool):
            return f"U+{value:04X}"
        return _bad(verb, value)
    return f"%!{verb}({type_name(value)}={sprint(value)})"


def sprintf(fmt: str, args: list[Any]) -> str:
    out: list[str] = []
    index = 0
    pos = 0
    for match in _VERB.finditer(fmt):
        out.append(fmt[pos : match.start()])
        pos = match.end()
        flags, width_text, precision_text, verb = match.groups()
        if verb == "%":
            out.append("%")
            continue
        width: int | None = None
        precision: int | None = None
        if width_text == "*":
            width = int(args[index]) if index < len(args) else None
            index += 1
        elif width_text:
            width = int(width_text)
        if precision_text == "*":
            precision = int(args[index]) if index < len(args) else None
            index += 1
        elif precision_text is not None:
            precision = int(precision_text)
        elif match.group(0).find(".") >= 0:
            precision = 0
        if index >= len(args):
            out.append(f"%!{verb}(MISSING)")
            continue
        value = args[index]
        index += 1
        out.append(_pad(format_one(verb, flags, precision, value), flags, width))
    out.append(fmt[pos:])
    if index < len(args):
        extra = ", ".join(f"{type_name(a)}={sprint(a)}" for a in args[index:])
        out.append(f"%!(EXTRA {extra})")
    return "".join(out)


def sprint_args(args: list[Any]) -> str:
    """fmt.Sprint: operands joined, with a space between two that are not strings."""
    out: list[str] = []
    for i, arg in enumerate(args):
        if i > 0 and not isinstance(arg, str) and not isinstance(args[i - 1], str):
            out.append(" ")
        out.append(sprint(None if arg is MISSING else arg))
    return "".join(out)


def sprintln_args(args: list[Any]) -> str:
    return " ".join(sprint(None if a is MISSING else a) for a in args) + "\n"
