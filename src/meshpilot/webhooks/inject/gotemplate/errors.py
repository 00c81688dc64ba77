"""The one error a template raises, for parse and execution failures alike."""

from __future__ import annotations


class TemplateError(Exception):
    """``template: NAME:LINE: message``, as Go's text/template words its errors."""

    def __init__(self, name: str, line: int, message: str) -> None:
        super().__init__(f"template: {name}:{line}: {message}")
        self.name = name
        self.line = line
        self.message = message
