"""Reading YAML and JSON files into documents, one object per document.

A file may hold several YAML documents and ``kind: List`` objects. Each
document is parsed on its own, so a syntax error in one leaves the others
readable. Timestamps stay strings, as the Kubernetes API sends them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import yaml

from meshpilot.config.errors import ConfigError

#: File suffixes the config directory reads.
CONFIG_SUFFIXES = (".yaml", ".yml", ".json")

_BaseLoader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _Loader(_BaseLoader):  # type: ignore[misc]
    """SafeLoader without the timestamp resolver: times stay text."""


_Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in _BaseLoader.yaml_implicit_resolvers.items()
}

# A line that starts a new YAML document; anything after the marker belongs to it.
_DOC_START = re.compile(r"^---(?=\s|$)", re.MULTILINE)


@dataclass(frozen=True, slots=True)
class Document:
    """One object from a file, or the reason it could not be read."""

    source: str
    #: 0-based index of the YAML document in the file.
    index: int
    #: Index inside a ``kind: List`` document, else None.
    item: int | None = None
    raw: dict[str, Any] | None = None
    error: ConfigError | None = None

    @property
    def where(self) -> str:
        """``file.yaml[doc 2]`` or ``file.yaml[doc 0, item 3]``, for messages."""
        if self.item is None:
            return f"{self.source}[doc {self.index}]"
        return f"{self.source}[doc {self.index}, item {self.item}]"


def split_yaml(text: str) -> list[tuple[str, int]]:
    """The YAML documents of a stream, each with the file line it starts on (0-based)."""
    starts = [0] + [m.start() for m in _DOC_START.finditer(text)]
    chunks = []
    for i, begin in enumerate(starts):
        end = starts[i + 1] if i + 1 < len(starts) else len(text)
        chunk = text[begin:end]
        if i > 0:
            chunk = chunk[3:]  # the "---" marker itself
        chunks.append((chunk, text.count("\n", 0, begin)))
    # Text before the first marker is a document only if it holds something.
    if len(chunks) > 1 and not _has_content(chunks[0][0]):
        chunks = chunks[1:]
    return chunks


def _has_content(text: str) -> bool:
    return any(line.strip() and not line.lstrip().startswith(("#", "%")) for line in text.splitlines())


def parse_text(text: str, source: str, *, json: bool = False) -> list[Document]:
    """Documents of a YAML (or JSON) text; empty documents are skipped."""
    docs: list[Document] = []
    if json:
        try:
            data = orjson.loads(text)
        except orjson.JSONDecodeError as err:
            return [Document(source, 0, error=ConfigError(f"invalid JSON: {err}"))]
        return _expand(data, source, 0)
    for index, (chunk, first_line) in enumerate(split_yaml(text)):
        try:
            data = yaml.load(chunk, Loader=_Loader)
        except yaml.YAMLError as err:
            reason = _yaml_reason(err, first_line)
            docs.append(Document(source, index, error=ConfigError(f"invalid YAML: {reason}")))
            continue
        docs.extend(_expand(data, source, index))
    return docs


def read_file(path: Path) -> list[Document]:
    try:
        raw = path.read_bytes()
    except OSError as err:
        return [Document(str(path), 0, error=ConfigError(f"cannot read file: {err.strerror or err}"))]
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return [Document(str(path), 0, error=ConfigError("file is not UTF-8 text"))]
    return parse_text(text, str(path), json=path.suffix == ".json")


def _expand(data: Any, source: str, index: int) -> list[Document]:
    if data is None:
        return []
    if not isinstance(data, dict):
        return [
            Document(
                source, index, error=ConfigError(f"a document must be an object, got {type(data).__name__}")
            )
        ]
    kind = data.get("kind")
    if isinstance(kind, str) and kind.endswith("List") and "items" in data:
        items = data.get("items") or []
        if not isinstance(items, list):
            return [Document(source, index, error=ConfigError("items must be a list", "items"))]
        out = []
        for i, item in enumerate(items):
            if isinstance(item, dict):
                out.append(Document(source, index, i, raw=item))
            else:
                out.append(Document(source, index, i, error=ConfigError("a list item must be an object")))
        return out
    return [Document(source, index, raw=data)]


def _yaml_reason(err: yaml.YAMLError, first_line: int) -> str:
    mark = getattr(err, "problem_mark", None)
    problem = getattr(err, "problem", None) or str(err)
    if mark is not None:
        return f"{problem} at line {first_line + mark.line + 1}, column {mark.column + 1}"
    return str(problem)
