"""The parse tree of a Go text/template (``text/template/parse``'s node types, as data)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Text:
    text: str


@dataclass
class Field:
    """``.A.B``: fields (or map keys, or methods) of dot."""

    names: list[str]


@dataclass
class Variable:
    """``$x.A.B``: a variable, then fields."""

    name: str
    names: list[str]


@dataclass
class Dot:
    pass


@dataclass
class Nil:
    pass


@dataclass
class Literal:
    """A bool, number or string constant."""

    value: bool | int | float | str


@dataclass
class Identifier:
    """A function name."""

    name: str


@dataclass
class Chain:
    """``(pipeline).A.B`` or ``$x`` … any operand followed by fields."""

    node: Node
    names: list[str]


@dataclass
class Command:
    args: list[Node]


@dataclass
class Pipeline:
    line: int
    declare: list[str] = field(default_factory=list)
    is_assign: bool = False
    commands: list[Command] = field(default_factory=list)


@dataclass
class Action:
    line: int
    pipe: Pipeline


@dataclass
class Branch:
    """``if``, ``with`` or ``range``."""

    keyword: str
    line: int
    pipe: Pipeline
    body: list[Node]
    else_body: list[Node] | None


@dataclass
class TemplateCall:
    line: int
    name: str
    pipe: Pipeline | None


@dataclass
class LoopControl:
    """``break`` or ``continue`` inside ``range``."""

    keyword: str
    line: int


Node = (
    Text
    | Field
    | Variable
    | Dot
    | Nil
    | Literal
    | Identifier
    | Chain
    | Command
    | Pipeline
    | Action
    | Branch
    | TemplateCall
    | LoopControl
)
