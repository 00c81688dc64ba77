"""Running a parsed template over data, with Go text/template's semantics.

Kept from Go: a field chain on a missing value is missing (prints ``<no value>``), on nil it is an
error; a pipeline yielding nil yields missing; ``and``/``or`` short-circuit and return an operand;
``range`` visits maps in key order and runs ``else`` when there is nothing to visit; variables live
until the end of the ``if``/``with``/``range``/template that declares them; a function that raises
fails the execution with ``error calling NAME: …``."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from meshpilot.webhooks.inject.gotemplate import nodes as n
from meshpilot.webhooks.inject.gotemplate.builtins import BUILTINS, RAW_ARGS
from meshpilot.webhooks.inject.gotemplate.errors import TemplateError
from meshpilot.webhooks.inject.gotemplate.parse import parse
from meshpilot.webhooks.inject.gotemplate.values import (
    MISSING,
    GoStruct,
    StrMap,
    sprint,
    truth,
    type_name,
)

FuncMap = Mapping[str, Callable[..., Any]]
_NO_FINAL: Any = object()
_MAX_DEPTH = 200


class _Break(Exception):
    pass


class _Continue(Exception):
    pass


class Template:
    """One template text, parsed once, with the functions it may call (Go's builtins, then ``funcs``
    in order, later maps overriding earlier ones as Go's ``Funcs`` does)."""

    def __init__(self, name: str, text: str, *funcs: FuncMap) -> None:
        self.name = name
        merged: dict[str, Callable[..., Any]] = dict(BUILTINS)
        for funcmap in funcs:
            merged.update(funcmap)
        self.funcs = merged
        self.body, self.defines = parse(name, text, merged)

    def execute(self, data: Any) -> str:
        state = _State(self, data)
        state.walk_list(data, self.body)
        return "".join(state.out)


class _State:
    def __init__(self, template: Template, data: Any) -> None:
        self.template = template
        self.out: list[str] = []
        self.vars: list[tuple[str, Any]] = [("$", data)]
        self.name = template.name
        self.line = 1
        self.depth = 0

    def error(self, message: str) -> TemplateError:
        return TemplateError(self.name, self.line, message)

    # -- variables
    def push(self, name: str, value: Any) -> None:
        self.vars.append((name, value))

    def set_var(self, name: str, value: Any) -> None:
        for i in range(len(self.vars) - 1, -1, -1):
            if self.vars[i][0] == name:
                self.vars[i] = (name, value)
                return
        raise self.error(f"undefined variable: {name}")

    def var(self, name: str) -> Any:
        for var_name, value in reversed(self.vars):
            if var_name == name:
                return value
        raise self.error(f"undefined variable: {name}")

    # -- statements
    def walk_list(self, dot: Any, body: list[n.Node]) -> None:
        for node in body:
            self.walk(dot, node)

    def walk(self, dot: Any, node: n.Node) -> None:
        if isinstance(node, n.Text):
            self.out.append(node.text)
        elif isinstance(node, n.Action):
            self.line = node.line
            value = self.pipeline(dot, node.pipe)
            if not node.pipe.declare:
                self.out.append(self.printable(value))
        elif isinstance(node, n.Branch):
            self.line = node.line
            mark = len(self.vars)
            if node.keyword == "range":
                self.walk_range(dot, node)
            else:
                value = self.pipeline(dot, node.pipe)
                if truth(value):
                    self.walk_list(value if node.keyword == "with" else dot, node.body)
                elif node.else_body is not None:
                    self.walk_list(dot, node.else_body)
            del self.vars[mark:]
        elif isinstance(node, n.TemplateCall):
            self.line = node.line
            self.call_template(dot, node)
        elif isinstance(node, n.LoopControl):
            raise _Break() if node.keyword == "break" else _Continue()
        else:
            raise self.error(f"unknown node {node!r}")

    def call_template(self, dot: Any, node: n.TemplateCall) -> None:
        body = self.template.defines.get(node.name)
        if body is None:
            raise self.error(f'executing "{self.name}": no such template "{node.name}"')
        new_dot = self.pipeline(dot, node.pipe) if node.pipe is not None else None
        if self.depth >= _MAX_DEPTH:
            raise self.error(f"exceeded maximum template depth ({_MAX_DEPTH})")
        saved = (self.vars, self.name, self.line)
        self.vars, self.name = [("$", new_dot)], node.name
        self.depth += 1
        try:
            self.walk_list(new_dot, body)
        finally:
            self.depth -= 1
            self.vars, self.name, self.line = saved

    def walk_range(self, dot: Any, node: n.Branch) -> None:
        value = self.pipeline(dot, n.Pipeline(node.pipe.line, commands=node.pipe.commands))
        items: list[tuple[Any, Any]]
        if value is MISSING:
            items = []
        elif isinstance(value, (list, tuple)):
            items = list(enumerate(value))
        elif isinstance(value, Mapping):
            items = [(k, value[k]) for k in sorted(value)]
        elif isinstance(value, int) and not isinstance(value, bool):
            if len(node.pipe.declare) > 1:
                raise self.error(f"can't use {value} to iterate over more than one variable")
            items = [(i, i) for i in range(value)]
        else:
            raise self.error(f"range can't iterate over {sprint(value)}")
        if not items:
            if node.else_body is not None:
                self.walk_list(dot, node.else_body)
            return
        declare = node.pipe.declare
        if not node.pipe.is_assign:
            for name in declare:
                self.push(name, MISSING)
        for key, elem in items:
            mark = len(self.vars)
            if len(declare) == 1:
                self.set_var(declare[0], elem)
            elif len(declare) == 2:
                self.set_var(declare[0], key)
                self.set_var(declare[1], elem)
            try:
                self.walk_list(elem, node.body)
            except _Break:
                break
            except _Continue:
                continue
            finally:
                del self.vars[mark:]

    # -- expressions
    def pipeline(self, dot: Any, pipe: n.Pipeline) -> Any:
        value: Any = _NO_FINAL
        for command in pipe.commands:
            value = self.command(dot, command, value)
        if value is None:
            value = MISSING  # Go turns a nil interface{} result into "no value"
        for name in pipe.declare:
            if pipe.is_assign:
                self.set_var(name, value)
            else:
                self.push(name, value)
        return value

    def command(self, dot: Any, command: n.Command, final: Any) -> Any:
        first, args = command.args[0], command.args[1:]
        if isinstance(first, n.Field):
            return self.field_chain(dot, dot, first.names, args, final)
        if isinstance(first, n.Variable):
            value = self.var(first.name)
            if first.names:
                return self.field_chain(dot, value, first.names, args, final)
            self.no_args(first.name, args, final)
            return value
        if isinstance(first, n.Chain):
            base = self.operand(dot, first.node)
            return self.field_chain(dot, base, first.names, args, final)
        if isinstance(first, n.Identifier):
            return self.function(dot, first.name, args, final)
        self.no_args(_describe(first), args, final)
        return self.operand(dot, first)

    def no_args(self, what: str, args: list[n.Node], final: Any) -> None:
        if args or final is not _NO_FINAL:
            raise self.error(f"can't give argument to non-function {what}")

    def operand(self, dot: Any, node: n.Node) -> Any:
        """The value of one argument."""
        if isinstance(node, n.Dot):
            return dot
        if isinstance(node, n.Nil):
            return None
        if isinstance(node, n.Literal):
            return node.value
        if isinstance(node, n.Field):
            return self.field_chain(dot, dot, node.names, [], _NO_FINAL)
        if isinstance(node, n.Variable):
            value = self.var(node.name)
            return self.field_chain(dot, value, node.names, [], _NO_FINAL) if node.names else value
        if isinstance(node, n.Chain):
            return self.field_chain(dot, self.operand(dot, node.node), node.names, [], _NO_FINAL)
        if isinstance(node, n.Pipeline):
            return self.pipeline(dot, node)
        if isinstance(node, n.Identifier):
            return self.function(dot, node.name, [], _NO_FINAL)
        raise self.error(f"can't evaluate {node!r}")

    def field_chain(self, dot: Any, receiver: Any, names: list[str], args: list[n.Node], final: Any) -> Any:
        for name in names[:-1]:
            receiver = self.field(dot, receiver, name, [], _NO_FINAL)
        return self.field(dot, receiver, names[-1], args, final)

    def field(self, dot: Any, receiver: Any, name: str, args: list[n.Node], final: Any) -> Any:
        if receiver is MISSING:
            return MISSING
        if receiver is None:
            raise self.error(f"nil pointer evaluating interface {{}}.{name}")
        has_args = bool(args) or final is not _NO_FINAL
        if isinstance(receiver, GoStruct):
            method = receiver.go_method(name)
            if method is not None:
                return self.call(name, method, self.arguments(dot, args, final, raw=False))
            try:
                value = receiver.go_field(name)
            except KeyError:
                raise self.error(f"can't evaluate field {name} in type {receiver.go_type()}") from None
            if has_args:
                raise self.error(f"{name} has arguments but cannot be invoked as function")
            return value
        if isinstance(receiver, Mapping):
            if has_args:
                raise self.error(f"{name} is not a method but has arguments")
            if isinstance(receiver, StrMap):
                return receiver.get(name, "")
            return receiver.get(name, MISSING)
        raise self.error(f"can't evaluate field {name} in type {type_name(receiver)}")

    def arguments(self, dot: Any, args: list[n.Node], final: Any, raw: bool) -> list[Any]:
        values = [self.operand(dot, a) for a in args]
        if final is not _NO_FINAL:
            values.append(final)
        if not raw:
            # A function declared with Go types receives nil where the template had no value.
            values = [None if v is MISSING else v for v in values]
        return values

    def function(self, dot: Any, name: str, args: list[n.Node], final: Any) -> Any:
        fn = self.template.funcs.get(name)
        if fn is None:
            raise self.error(f'"{name}" is not a defined function')
        if fn is BUILTINS.get(name) and name in ("and", "or"):
            return self.and_or(dot, name, args, final)
        return self.call(name, fn, self.arguments(dot, args, final, raw=name in RAW_ARGS))

    def and_or(self, dot: Any, name: str, args: list[n.Node], final: Any) -> Any:
        nodes: list[Any] = list(args) + ([final] if final is not _NO_FINAL else [])
        if not nodes:
            raise self.error(f"wrong number of args for {name}: want at least 1 got 0")
        value: Any = MISSING
        for i, item in enumerate(nodes):
            is_final = final is not _NO_FINAL and i == len(nodes) - 1
            value = item if is_final else self.operand(dot, item)
            if truth(value) == (name == "or"):
                return value
        return value

    def call(self, name: str, fn: Callable[..., Any], args: list[Any]) -> Any:
        try:
            return fn(*args)
        except TemplateError:
            raise
        except RecursionError:
            raise self.error(f"error calling {name}: too deeply nested") from None
        except Exception as err:  # Go recovers a function's panic the same way
            raise self.error(f"error calling {name}: {err}") from None

    def printable(self, value: Any) -> str:
        return sprint(value)


def _describe(node: n.Node) -> str:
    if isinstance(node, n.Literal):
        return repr(node.value)
    if isinstance(node, n.Nil):
        return "nil"
    return type(node).__name__.lower()
