"""Tokens of a Go text/template: text between actions, and the pieces of each ``{{ … }}`` action.

Follows Go's ``text/template/parse`` lexer: ``{{- `` and `` -}}`` (the dash must touch the delimiter
and be followed or preceded by a space) trim the white space of the adjacent text; ``{{/* … */}}`` is
a comment; spaces inside actions are kept as tokens because they separate arguments
(``(x).F`` is a chain, ``(x) .F`` two arguments)."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from meshpilot.webhooks.inject.gotemplate.errors import TemplateError

LEFT, RIGHT = "{{", "}}"
KEYWORDS = frozenset(
    {"block", "break", "continue", "define", "else", "end", "if", "range", "nil", "template", "with"}
)


class Kind(enum.Enum):
    TEXT = "text"
    LEFT = "{{"
    RIGHT = "}}"
    SPACE = "space"
    IDENT = "identifier"  # a function name
    KEYWORD = "keyword"
    FIELD = "field"  # .Name
    DOT = "."
    VARIABLE = "variable"  # $ or $name
    STRING = "string"  # a quoted or raw string, already unquoted
    CHAR = "char"
    NUMBER = "number"
    BOOL = "bool"
    PIPE = "|"
    LPAREN = "("
    RPAREN = ")"
    DECLARE = ":="
    ASSIGN = "="
    COMMA = ","
    EOF = "EOF"


@dataclass(frozen=True)
class Token:
    kind: Kind
    value: str
    line: int


_ESCAPES = {
    "a": "\a",
    "b": "\b",
    "f": "\f",
    "n": "\n",
    "r": "\r",
    "t": "\t",
    "v": "\v",
    "\\": "\\",
    "'": "'",
    '"': '"',
}


def unquote(body: str, quote: str, name: str, line: int) -> str:
    """A Go interpreted string or char literal's value (without its quotes)."""
    out: list[str] = []
    i = 0
    while i < len(body):
        c = body[i]
        if c != "\\":
            out.append(c)
            i += 1
            continue
        i += 1
        e = body[i] if i < len(body) else ""
        if e in _ESCAPES and (e != "'" or quote == "'") and (e != '"' or quote == '"'):
            out.append(_ESCAPES[e])
            i += 1
        elif e in "xuU":
            width = {"x": 2, "u": 4, "U": 8}[e]
            digits = body[i + 1 : i + 1 + width]
            if len(digits) != width or any(d not in "0123456789abcdefABCDEF" for d in digits):
                raise TemplateError(name, line, f"bad escape \\{e} in {quote}{body}{quote}")
            out.append(chr(int(digits, 16)))
            i += 1 + width
        elif e in "01234567":
            digits = body[i : i + 3]
            if len(digits) != 3 or any(d not in "01234567" for d in digits):
                raise TemplateError(name, line, f"bad octal escape in {quote}{body}{quote}")
            out.append(chr(int(digits, 8)))
            i += 3
        else:
            raise TemplateError(name, line, f"unknown escape \\{e} in {quote}{body}{quote}")
    return "".join(out)


def _is_alnum(c: str) -> bool:
    return c == "_" or c.isalnum()


class Lexer:
    def __init__(self, name: str, text: str) -> None:
        self.name = name
        self.text = text
        self.pos = 0
        self.line = 1
        self.tokens: list[Token] = []

    def _error(self, message: str) -> TemplateError:
        return TemplateError(self.name, self.line, message)

    def _emit(self, kind: Kind, value: str, line: int | None = None) -> None:
        self.tokens.append(Token(kind, value, self.line if line is None else line))

    def run(self) -> list[Token]:
        text = self.text
        while self.pos < len(text):
            start = text.find(LEFT, self.pos)
            if start < 0:
                self._text(text[self.pos :])
                self.pos = len(text)
                break
            trim_left = (
                text.startswith("-", start + 2) and start + 3 < len(text) and text[start + 3] in " \t\r\n"
            )
            chunk = text[self.pos : start]
            if trim_left:
                chunk = chunk.rstrip(" \t\r\n")
            self._text(chunk)
            self.line += text.count("\n", len(chunk) + self.pos, start)
            self.pos = start + 2 + (2 if trim_left else 0)
            self._action()
        self._emit(Kind.EOF, "")
        return self.tokens

    def _text(self, chunk: str) -> None:
        if chunk:
            self._emit(Kind.TEXT, chunk)
            self.line += chunk.count("\n")

    def _after_right(self, trim: bool) -> None:
        if trim:
            end = self.pos
            while end < len(self.text) and self.text[end] in " \t\r\n":
                end += 1
            self.line += self.text.count("\n", self.pos, end)
            self.pos = end

    def _at_right(self) -> tuple[bool, bool]:
        """(an action's end is here, it trims)."""
        text, pos = self.text, self.pos
        if text.startswith(" -" + RIGHT, pos) or (
            pos < len(text) and text[pos] in " \t\r\n" and text.startswith("-" + RIGHT, pos + 1)
        ):
            return True, True
        return text.startswith(RIGHT, pos), False

    def _action(self) -> None:
        text = self.text
        # A comment must follow the delimiter (and trim marker) directly and end the action.
        if text.startswith("/*", self.pos):
            end = text.find("*/", self.pos + 2)
            if end < 0:
                raise self._error("unclosed comment")
            self.line += text.count("\n", self.pos, end)
            self.pos = end + 2
            at, trim = self._at_right()
            if not at:
                raise self._error("comment ends before closing delimiter")
            self.pos += 4 if trim else 2
            self._after_right(trim)
            return
        self._emit(Kind.LEFT, LEFT)
        depth = 0
        while True:
            at, trim = self._at_right()
            if at:
                if depth:
                    raise self._error("unclosed left paren")
                self.pos += 4 if trim else 2
                self._emit(Kind.RIGHT, RIGHT)
                self._after_right(trim)
                return
            if self.pos >= len(text):
                raise self._error("unclosed action")
            c = text[self.pos]
            if c in " \t\r\n":
                end = self.pos
                while end < len(text) and text[end] in " \t\r\n":
                    end += 1
                # A trim marker's space belongs to the marker.
                if text.startswith("-" + RIGHT, end) and end > self.pos:
                    end -= 1
                self._emit(Kind.SPACE, text[self.pos : end])
                self.line += text.count("\n", self.pos, end)
                self.pos = max(end, self.pos + 1)
            elif c == "(":
                depth += 1
                self._single(Kind.LPAREN)
            elif c == ")":
                depth -= 1
                if depth < 0:
                    raise self._error("unexpected right paren")
                self._single(Kind.RPAREN)
            elif c == "|":
                self._single(Kind.PIPE)
            elif c == ",":
                self._single(Kind.COMMA)
            elif c == "=":
                self._single(Kind.ASSIGN)
            elif c == ":":
                if not text.startswith(":=", self.pos):
                    raise self._error("expected :=")
                self._emit(Kind.DECLARE, ":=")
                self.pos += 2
            elif c == '"':
                self._quoted('"', Kind.STRING)
            elif c == "'":
                self._quoted("'", Kind.CHAR)
            elif c == "`":
                end = text.find("`", self.pos + 1)
                if end < 0:
                    raise self._error("unterminated raw quoted string")
                body = text[self.pos + 1 : end]
                self._emit(Kind.STRING, body)
                self.line += body.count("\n")
                self.pos = end + 1
            elif c == "$":
                end = self.pos + 1
                while end < len(text) and _is_alnum(text[end]):
                    end += 1
                self._emit(Kind.VARIABLE, text[self.pos : end])
                self.pos = end
            elif c == ".":
                nxt = text[self.pos + 1 : self.pos + 2]
                if nxt.isdigit():
                    self._number()
                    continue
                end = self.pos + 1
                while end < len(text) and _is_alnum(text[end]):
                    end += 1
                if end == self.pos + 1:
                    self._single(Kind.DOT)
                else:
                    self._emit(Kind.FIELD, text[self.pos + 1 : end])
                    self.pos = end
            elif c.isdigit() or (c in "+-" and text[self.pos + 1 : self.pos + 2].isdigit()):
                self._number()
            elif _is_alnum(c):
                end = self.pos
                while end < len(text) and _is_alnum(text[end]):
                    end += 1
                word = text[self.pos : end]
                if word in KEYWORDS:
                    self._emit(Kind.KEYWORD, word)
                elif word in ("true", "false"):
                    self._emit(Kind.BOOL, word)
                else:
                    self._emit(Kind.IDENT, word)
                self.pos = end
            else:
                raise self._error(f"unrecognized character in action: {c!r}")

    def _single(self, kind: Kind) -> None:
        self._emit(kind, self.text[self.pos])
        self.pos += 1

    def _quoted(self, quote: str, kind: Kind) -> None:
        text = self.text
        end = self.pos + 1
        while True:
            if end >= len(text) or text[end] == "\n":
                what = "string" if quote == '"' else "character"
                raise self._error(f"unterminated quoted {what}")
            if text[end] == "\\":
                end += 2
                continue
            if text[end] == quote:
                break
            end += 1
        self._emit(kind, unquote(text[self.pos + 1 : end], quote, self.name, self.line))
        self.pos = end + 1

    def _number(self) -> None:
        text = self.text
        end = self.pos
        while end < len(text) and (_is_alnum(text[end]) or text[end] in ".+-"):
            # A sign belongs to the number only at its start or after an exponent.
            if text[end] in "+-" and end > self.pos and text[end - 1] not in "eEpP":
                break
            end += 1
        self._emit(Kind.NUMBER, text[self.pos : end])
        self.pos = end


def lex(name: str, text: str) -> list[Token]:
    return Lexer(name, text).run()
