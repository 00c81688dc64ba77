"""Go text/template's grammar: tokens to a tree, with ``define``d templates collected by name.

As in Go, functions and variables are checked when parsing: an unknown function or an undeclared
``$variable`` is a parse error; ``{{else if …}}`` and ``{{else with …}}`` nest a branch that shares
the enclosing ``{{end}}``."""

from __future__ import annotations

from collections.abc import Container

from meshpilot.webhooks.inject.gotemplate import nodes as n
from meshpilot.webhooks.inject.gotemplate.errors import TemplateError
from meshpilot.webhooks.inject.gotemplate.lexer import Kind, Token, lex


def parse_number(text: str) -> int | float:
    """A Go number literal: decimal, 0x/0o/0b integers, underscores, floats."""
    clean = text.replace("_", "")
    try:
        return int(clean, 0)
    except ValueError:
        pass
    if clean.lower().startswith(("0x", "-0x", "+0x")):
        return float.fromhex(clean)
    return float(clean)


class Parser:
    def __init__(self, name: str, text: str, funcs: Container[str]) -> None:
        self.name = name
        self.tokens = lex(name, text)
        self.pos = 0
        self.funcs = funcs
        self.vars: list[str] = ["$"]
        self.defines: dict[str, list[n.Node]] = {}
        self.range_depth = 0

    # -- tokens
    def _peek(self) -> Token:
        return self.tokens[self.pos]

    def _next(self) -> Token:
        token = self.tokens[self.pos]
        if token.kind is not Kind.EOF:
            self.pos += 1
        return token

    def _peek_non_space(self) -> Token:
        while self.tokens[self.pos].kind is Kind.SPACE:
            self.pos += 1
        return self.tokens[self.pos]

    def _next_non_space(self) -> Token:
        self._peek_non_space()
        return self._next()

    def _error(self, message: str, token: Token | None = None) -> TemplateError:
        return TemplateError(self.name, (token or self._peek()).line, message)

    def _expect(self, kind: Kind, context: str) -> Token:
        token = self._next_non_space()
        if token.kind is not kind:
            raise self._error(f"unexpected {_describe(token)} in {context}", token)
        return token

    # -- structure
    def parse(self) -> list[n.Node]:
        body, end = self._list()
        if end is not None:
            raise self._error(f"unexpected {{{{{end.value}}}}}", end)
        return body

    def _list(self) -> tuple[list[n.Node], Token | None]:
        """Items up to ``{{end}}`` or ``{{else}}`` (returned, consumed up to the keyword) or EOF."""
        out: list[n.Node] = []
        while True:
            token = self._next()
            if token.kind is Kind.EOF:
                return out, None
            if token.kind is Kind.TEXT:
                out.append(n.Text(token.value))
                continue
            keyword = self._peek_non_space()
            if keyword.kind is Kind.KEYWORD:
                if keyword.value in ("end", "else"):
                    self._next()
                    return out, keyword
                self._next()
                node = self._keyword(keyword)
                if node is not None:
                    out.append(node)
                continue
            out.append(n.Action(token.line, self._pipeline("command", Kind.RIGHT)))

    def _keyword(self, token: Token) -> n.Node | None:
        word = token.value
        if word in ("if", "with", "range"):
            return self._control(word, token.line)
        if word == "template":
            return self._template(token)
        if word == "define":
            self._define(token, block=False)
            return None
        if word == "block":
            return self._define(token, block=True)
        if word in ("break", "continue"):
            if not self.range_depth:
                raise self._error(f"{{{{{word}}}}} outside {{{{range}}}}", token)
            self._expect(Kind.RIGHT, word)
            return n.LoopControl(word, token.line)
        raise self._error(f"unexpected {{{{{word}}}}}", token)

    def _control(self, keyword: str, line: int) -> n.Branch:
        mark = len(self.vars)
        pipe = self._pipeline(keyword, Kind.RIGHT)
        if keyword == "range":
            self.range_depth += 1
        body, end = self._list()
        if keyword == "range":
            self.range_depth -= 1
        else_body: list[n.Node] | None = None
        if end is None:
            raise self._error(f"unexpected EOF: {{{{{keyword}}}}} without {{{{end}}}}")
        if end.value == "else":
            nxt = self._peek_non_space()
            if keyword != "range" and nxt.kind is Kind.KEYWORD and nxt.value in ("if", "with"):
                # {{else if x}} … {{end}}: the nested branch consumes the shared {{end}}.
                self._next()
                else_body = [self._control(nxt.value, nxt.line)]
            else:
                self._expect(Kind.RIGHT, "else")
                else_body, end = self._list()
                if end is None or end.value != "end":
                    raise self._error(f"expected {{{{end}}}} to close {{{{{keyword}}}}}")
                self._expect(Kind.RIGHT, "end")
        else:
            self._expect(Kind.RIGHT, "end")
        del self.vars[mark:]
        return n.Branch(keyword, line, pipe, body, else_body)

    def _template(self, token: Token) -> n.TemplateCall:
        name = self._expect(Kind.STRING, "template clause")
        if self._peek_non_space().kind is Kind.RIGHT:
            self._next()
            return n.TemplateCall(token.line, name.value, None)
        return n.TemplateCall(token.line, name.value, self._pipeline("template clause", Kind.RIGHT))

    def _define(self, token: Token, block: bool) -> n.TemplateCall | None:
        context = "block clause" if block else "define clause"
        name = self._expect(Kind.STRING, context)
        pipe = None
        if block:
            pipe = self._pipeline(context, Kind.RIGHT)
        else:
            self._expect(Kind.RIGHT, context)
        saved_vars, saved_depth = self.vars, self.range_depth
        self.vars, self.range_depth = ["$"], 0
        body, end = self._list()
        self.vars, self.range_depth = saved_vars, saved_depth
        if end is None or end.value != "end":
            raise self._error(f"unexpected EOF: {{{{{'block' if block else 'define'}}}}} without {{{{end}}}}")
        self._expect(Kind.RIGHT, "end")
        self.defines[name.value] = body
        return n.TemplateCall(token.line, name.value, pipe) if block else None

    # -- pipelines
    def _pipeline(self, context: str, end: Kind) -> n.Pipeline:
        pipe = n.Pipeline(self._peek().line)
        start = self.pos
        token = self._peek_non_space()
        if token.kind is Kind.VARIABLE:
            self._next()
            after = self._peek_non_space()
            if after.kind in (Kind.DECLARE, Kind.ASSIGN):
                self._next()
                pipe.declare = [token.value]
                pipe.is_assign = after.kind is Kind.ASSIGN
            elif after.kind is Kind.COMMA and context == "range":
                self._next()
                second = self._expect(Kind.VARIABLE, "range declaration")
                op = self._next_non_space()
                if op.kind not in (Kind.DECLARE, Kind.ASSIGN):
                    raise self._error("range can only initialize variables", op)
                pipe.declare = [token.value, second.value]
                pipe.is_assign = op.kind is Kind.ASSIGN
            else:
                self.pos = start
        for var in pipe.declare:
            if pipe.is_assign:
                if var not in self.vars:
                    raise self._error(f"undefined variable {var!r}", token)
            else:
                self.vars.append(var)
        while True:
            token = self._peek_non_space()
            if token.kind is end:
                self._next()
                break
            pipe.commands.append(self._command(context, end))
            token = self._peek_non_space()
            if token.kind is Kind.PIPE:
                self._next()
                continue
            if token.kind is not end:
                raise self._error(f"unexpected {_describe(token)} in {context}", token)
        if not pipe.commands:
            raise self._error(f"missing value for {context}")
        return pipe

    def _command(self, context: str, end: Kind) -> n.Command:
        args: list[n.Node] = []
        while True:
            self._peek_non_space()
            args.append(self._operand(context))
            token = self._peek()
            if token.kind is Kind.SPACE:
                following = self._peek_non_space()
                if following.kind in (end, Kind.PIPE):
                    break
                continue
            if token.kind in (end, Kind.PIPE):
                break
            raise self._error(f"unexpected {_describe(token)} in operand", token)
        return n.Command(args)

    def _operand(self, context: str) -> n.Node:
        node = self._term(context)
        names: list[str] = []
        while self._peek().kind is Kind.FIELD:
            names.append(self._next().value)
        if not names:
            return node
        if isinstance(node, n.Field):
            return n.Field(node.names + names)
        if isinstance(node, n.Variable):
            return n.Variable(node.name, node.names + names)
        if isinstance(node, (n.Literal, n.Nil, n.Dot)):
            raise self._error(f"unexpected . after term {_node_text(node)!r}")
        return n.Chain(node, names)

    def _term(self, context: str) -> n.Node:
        token = self._next_non_space()
        kind = token.kind
        if kind is Kind.IDENT:
            if token.value not in self.funcs:
                raise self._error(f'function "{token.value}" not defined', token)
            return n.Identifier(token.value)
        if kind is Kind.DOT:
            return n.Dot()
        if kind is Kind.KEYWORD and token.value == "nil":
            return n.Nil()
        if kind is Kind.VARIABLE:
            if token.value not in self.vars:
                raise self._error(f'undefined variable "{token.value}"', token)
            return n.Variable(token.value, [])
        if kind is Kind.FIELD:
            return n.Field([token.value])
        if kind is Kind.BOOL:
            return n.Literal(token.value == "true")
        if kind is Kind.STRING:
            return n.Literal(token.value)
        if kind is Kind.CHAR:
            if len(token.value) != 1:
                raise self._error(f"malformed character constant: '{token.value}'", token)
            return n.Literal(ord(token.value))
        if kind is Kind.NUMBER:
            try:
                return n.Literal(parse_number(token.value))
            except ValueError:
                raise self._error(f"bad number syntax: {token.value!r}", token) from None
        if kind is Kind.LPAREN:
            return self._pipeline("parenthesized pipeline", Kind.RPAREN)
        raise self._error(f"unexpected {_describe(token)} in {context}", token)


def _describe(token: Token) -> str:
    if token.kind is Kind.EOF:
        return "EOF"
    if token.kind is Kind.RIGHT:
        return '"}}"'
    return f"{token.kind.value} {token.value!r}"


def _node_text(node: n.Node) -> str:
    if isinstance(node, n.Literal):
        return repr(node.value)
    return "nil" if isinstance(node, n.Nil) else "."


def parse(name: str, text: str, funcs: Container[str]) -> tuple[list[n.Node], dict[str, list[n.Node]]]:
    """The tree of ``text`` and the templates it ``define``s (``block`` also defines)."""
    parser = Parser(name, text, funcs)
    body = parser.parse()
    return body, parser.defines
