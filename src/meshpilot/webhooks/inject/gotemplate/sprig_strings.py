"""sprig's string functions (argument order as sprig's: the piped string last)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from meshpilot.config.validation.formatting import go_quote
from meshpilot.webhooks.inject.gotemplate.builtins import FuncError
from meshpilot.webhooks.inject.gotemplate.convert import strslice, strval, to_int


def quote(*values: Any) -> str:
    return " ".join(go_quote(strval(v)) for v in values if v is not None)


def squote(*values: Any) -> str:
    return " ".join("'" + strval(v) + "'" for v in values if v is not None)


def indent(spaces: Any, text: Any) -> str:
    pad = " " * to_int(spaces)
    return pad + strval(text).replace("\n", "\n" + pad)


def nindent(spaces: Any, text: Any) -> str:
    return "\n" + indent(spaces, text)


def trunc(count: Any, text: Any) -> str:
    n, s = to_int(count), strval(text)
    if n < 0 and len(s) + n > 0:
        return s[len(s) + n :]
    if n >= 0 and len(s) > n:
        return s[:n]
    return s


def _go_title(text: str) -> str:
    out = []
    previous = " "
    for c in text:
        out.append(c.upper() if not (previous.isalnum() or previous == "_" or previous == "'") else c)
        previous = c
    return "".join(out)


def split(sep: Any, text: Any) -> dict[str, str]:
    return {f"_{i}": part for i, part in enumerate(_go_split(strval(text), strval(sep)))}


def _go_split(text: str, sep: str) -> list[str]:
    # strings.Split with an empty separator splits after each character.
    return list(text) if sep == "" else text.split(sep)


def _go_regex(pattern: Any) -> re.Pattern[str]:
    try:
        return re.compile(strval(pattern))
    except re.error as err:
        raise FuncError(f"error parsing regexp: {err}") from None


_GO_REPL = re.compile(r"\$(?:\{(\w+)\}|(\w+))|\\")


def _go_replacement(repl: str) -> str:
    """Go's ``$1``/``${name}`` expansion, in Python's ``\\g<…>`` syntax."""

    def sub(match: re.Match[str]) -> str:
        if match.group(0) == "\\":
            return "\\\\"
        return "\\g<" + (match.group(1) or match.group(2)) + ">"

    return _GO_REPL.sub(sub, repl)


def _regex_replace_all(pattern: Any, text: Any, repl: Any) -> str:
    regex = _go_regex(pattern)
    replacement = _go_replacement(strval(repl))
    try:
        return regex.sub(replacement, strval(text))
    except (re.error, IndexError):
        # Go expands an unknown group to nothing.
        return regex.sub(lambda m: "", strval(text))


STRING_FUNCS: dict[str, Callable[..., Any]] = {
    "quote": quote,
    "squote": squote,
    "indent": indent,
    "nindent": nindent,
    "trim": lambda text: strval(text).strip(" \t\n\r\v\f\u0085\u00a0"),
    "trimAll": lambda cutset, text: strval(text).strip(strval(cutset)),
    "trimPrefix": lambda prefix, text: strval(text).removeprefix(strval(prefix)),
    "trimSuffix": lambda suffix, text: strval(text).removesuffix(strval(suffix)),
    "hasPrefix": lambda prefix, text: strval(text).startswith(strval(prefix)),
    "hasSuffix": lambda suffix, text: strval(text).endswith(strval(suffix)),
    "contains": lambda substr, text: strval(substr) in strval(text),
    "split": split,
    "splitList": lambda sep, text: _go_split(strval(text), strval(sep)),
    "join": lambda sep, items: strval(sep).join(strslice(items)),
    "replace": lambda old, new, text: strval(text).replace(strval(old), strval(new)),
    "lower": lambda text: strval(text).lower(),
    "upper": lambda text: strval(text).upper(),
    "title": lambda text: _go_title(strval(text)),
    "trunc": trunc,
    "repeat": lambda count, text: strval(text) * max(to_int(count), 0),
    "nospace": lambda text: "".join(strval(text).split()),
    "cat": lambda *values: " ".join(strval(v) for v in values if v is not None),
    "toString": strval,
    "toStrings": strslice,
    "regexMatch": lambda pattern, text: _go_regex(pattern).search(strval(text)) is not None,
    "regexReplaceAll": _regex_replace_all,
    "regexFindAll": lambda pattern, text, n: _go_regex(pattern).findall(strval(text))[
        : None if to_int(n) < 0 else to_int(n)
    ],
}
