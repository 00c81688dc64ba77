"""Whether a text parses as a CEL expression (the syntax only, as istiod's ``celEnv.Parse`` checks).

Telemetry access-log filters are CEL expressions that Envoy compiles when it loads a listener; one
that does not parse makes Envoy reject the whole listener update, so istiod refuses the Telemetry
object instead. This is a recursive-descent recognizer of CEL's grammar (the language definition's
``Expr`` down to literals); it does not type-check, as istiod's parse step does not either.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_RESERVED = frozenset(
    {
        "as",
        "break",
        "const",
        "continue",
        "else",
        "for",
        "function",
        "if",
        "import",
        "let",
        "loop",
        "package",
        "namespace",
        "return",
        "var",
        "void",
        "while",
    }
)
_LITERAL_WORDS = frozenset({"true", "false", "null"})

_QUOTED = "|".join(
    (
        r'"""[\s\S]*?"""',
        r"'''[\s\S]*?'''",
        r'"(?:\\.|[^"\\\n])*"',
        r"'(?:\\.|[^'\\\n])*'",
    )
)
_TOKEN = re.compile(
    "|".join(
        (
            r"(?P<space>\s+|//[^\n]*)",
            rf"(?P<string>[rR]?[bB]?[rR]?(?:{_QUOTED}))",
            r"(?P<number>0x[0-9a-fA-F]+[uU]?|\d*\.\d+(?:[eE][+-]?\d+)?|\d+[eE][+-]?\d+|\d+[uU]?)",
            r"(?P<ident>[A-Za-z_][A-Za-z0-9_]*)",
            r"(?P<op>==|!=|<=|>=|&&|\|\||[-+*/%!<>?:.,()\[\]{}])",
        )
    )
)


class CelSyntaxError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class _Token:
    kind: str
    text: str
    at: int


def _tokens(text: str) -> list[_Token]:
    out: list[_Token] = []
    pos = 0
    while pos < len(text):
        found = _TOKEN.match(text, pos)
        if found is None:
            raise CelSyntaxError(f"unexpected character {text[pos]!r} at {pos}")
        kind = found.lastgroup or ""
        if kind != "space":
            out.append(_Token(kind, found.group(), pos))
        pos = found.end()
    return out


class _Parser:
    def __init__(self, tokens: list[_Token]) -> None:
        self.tokens = tokens
        self.pos = 0

    def peek(self, offset: int = 0) -> _Token | None:
        at = self.pos + offset
        return self.tokens[at] if at < len(self.tokens) else None

    def is_op(self, *texts: str) -> bool:
        token = self.peek()
        return token is not None and token.kind == "op" and token.text in texts

    def take_op(self, text: str) -> None:
        if not self.is_op(text):
            token = self.peek()
            where = f"{token.text!r} at {token.at}" if token else "end of expression"
            raise CelSyntaxError(f"expected {text!r}, found {where}")
        self.pos += 1

    def expr(self) -> None:
        self.binary(0)
        if self.is_op("?"):
            self.pos += 1
            self.binary(0)
            self.take_op(":")
            self.expr()

    # Binary operators by precedence, lowest first; "in" is a relation.
    _LEVELS: tuple[tuple[str, ...], ...] = (
        ("||",),
        ("&&",),
        ("==", "!=", "<", "<=", ">", ">=", "in"),
        ("+", "-"),
        ("*", "/", "%"),
    )

    def binary(self, level: int) -> None:
        if level == len(self._LEVELS):
            self.unary()
            return
        self.binary(level + 1)
        while True:
            token = self.peek()
            if token is None or token.text not in self._LEVELS[level]:
                return
            if token.kind not in ("op", "ident"):
                return
            self.pos += 1
            self.binary(level + 1)

    def unary(self) -> None:
        while self.is_op("!", "-"):
            self.pos += 1
        self.member()

    def member(self) -> None:
        self.primary()
        while True:
            if self.is_op("."):
                self.pos += 1
                self.identifier()
                if self.is_op("("):
                    self.arguments(")")
            elif self.is_op("["):
                self.pos += 1
                self.expr()
                self.take_op("]")
            elif self.is_op("{"):
                # A message construction after a (qualified) type name.
                self.pos += 1
                self.inits(field_names=True)
            else:
                return

    def identifier(self) -> None:
        token = self.peek()
        if token is None or token.kind != "ident" or token.text in _RESERVED or token.text == "in":
            where = f"{token.text!r} at {token.at}" if token else "end of expression"
            raise CelSyntaxError(f"expected an identifier, found {where}")
        self.pos += 1

    def arguments(self, close: str) -> None:
        self.pos += 1  # the opening bracket
        if self.is_op(close):
            self.pos += 1
            return
        while True:
            self.expr()
            if self.is_op(","):
                self.pos += 1
                if self.is_op(close):
                    break  # a trailing comma
                continue
            break
        self.take_op(close)

    def inits(self, *, field_names: bool) -> None:
        """Map or message entries up to ``}`` (the ``{`` is taken)."""
        if self.is_op("}"):
            self.pos += 1
            return
        while True:
            if field_names:
                self.identifier()
            else:
                self.expr()
            self.take_op(":")
            self.expr()
            if self.is_op(","):
                self.pos += 1
                if self.is_op("}"):
                    break
                continue
            break
        self.take_op("}")

    def primary(self) -> None:
        token = self.peek()
        if token is None:
            raise CelSyntaxError("unexpected end of expression")
        if token.kind in ("string", "number") or (token.kind == "ident" and token.text in _LITERAL_WORDS):
            self.pos += 1
        elif self.is_op("."):
            self.pos += 1
            self.identifier()
            if self.is_op("("):
                self.arguments(")")
        elif token.kind == "ident":
            self.identifier()
            if self.is_op("("):
                self.arguments(")")
        elif self.is_op("("):
            self.pos += 1
            self.expr()
            self.take_op(")")
        elif self.is_op("["):
            self.arguments("]")
        elif self.is_op("{"):
            self.pos += 1
            self.inits(field_names=False)
        else:
            raise CelSyntaxError(f"unexpected {token.text!r} at {token.at}")


def check(text: str) -> None:
    """Raise CelSyntaxError unless ``text`` is one CEL expression."""
    tokens = _tokens(text)
    if not tokens:
        raise CelSyntaxError("empty expression")
    parser = _Parser(tokens)
    parser.expr()
    rest = parser.peek()
    if rest is not None:
        raise CelSyntaxError(f"unexpected {rest.text!r} at {rest.at}")
