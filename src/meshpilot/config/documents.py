"""Reading YAML and JSON files into documents, one object per document.

A file may hold several YAML documents and ``kind: List`` objects. Each
document is parsed on its own, so a syntax error in one leaves the others
readable. Timestamps stay strings, as the Kubernetes API sends them.

A file over a limit of ``FileLimits`` (size, documents) is one rejected
"document" for the whole file (index ``WHOLE_FILE``); a document that nests
too deep or aliases too much is rejected alone.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import yaml

from meshpilot.config.errors import ConfigError
from meshpilot.config.file_limits import DEFAULT_LIMITS, FileLimits, LimitExceeded, check_value

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

#: The index of a Document that stands for the whole file (rejected before its documents were read).
WHOLE_FILE = -1


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
        """``file.yaml[doc 2]`` or ``file.yaml[doc 0, item 3]`` (``file.yaml``: the whole file)."""
        if self.index == WHOLE_FILE:
            return self.source
        if self.item is None:
            return f"{self.source}[doc {self.index}]"
        return f"{self.source}[doc {self.index}, item {self.item}]"


def split_yaml(text: str) -> list[tuple[str, int]]:
    """The YAML documents of a stream, each with the file line it starts on (0-based)."""
    starts = [0] + [m.start() for m in _DOC_START.finditer(text)]
    chunks = []
    line = 0
    for i, begin in enumerate(starts):
        end = starts[i + 1] if i + 1 < len(starts) else len(text)
        chunk = text[begin:end]
        if i > 0:
            chunk = chunk[3:]  # the "---" marker itself
        chunks.append((chunk, line))
        # Counted chunk by chunk: counting from the start of the text for each document was
        # quadratic in the number of documents.
        line += text.count("\n", begin, end)
    # Text before the first marker is a document only if it holds something.
    if len(chunks) > 1 and not _has_content(chunks[0][0]):
        chunks = chunks[1:]
    return chunks


def _has_content(text: str) -> bool:
    return any(line.strip() and not line.lstrip().startswith(("#", "%")) for line in text.splitlines())


def parse_text(
    text: str, source: str, *, json: bool = False, limits: FileLimits = DEFAULT_LIMITS
) -> list[Document]:
    """Documents of a YAML (or JSON) text; empty documents are skipped."""
    docs: list[Document] = []
    if json:
        try:
            data = orjson.loads(text)
        except orjson.JSONDecodeError as err:
            return [Document(source, 0, error=ConfigError(f"invalid JSON: {err}"))]
        return _checked(data, source, 0, limits)
    chunks = split_yaml(text)
    if len(chunks) > limits.max_documents:
        return [_too_many(source, limits)]
    for index, (chunk, first_line) in enumerate(chunks):
        try:
            data = yaml.load(chunk, Loader=_Loader)
        except yaml.YAMLError as err:
            reason = _yaml_reason(err, first_line)
            docs.append(Document(source, index, error=ConfigError(f"invalid YAML: {reason}")))
            continue
        except RecursionError:  # a safety net: libyaml and check_value bound nesting first
            docs.append(Document(source, index, error=LimitExceeded("nested too deep to parse")))
            continue
        docs.extend(_checked(data, source, index, limits))
        if len(docs) > limits.max_documents:
            return [_too_many(source, limits)]
    return docs


def read_file(path: Path, limits: FileLimits = DEFAULT_LIMITS) -> list[Document]:
    source = str(path)
    try:
        raw = _read_bounded(path, limits.max_bytes)
    except LimitExceeded as err:
        return [Document(source, WHOLE_FILE, error=err)]
    except OSError as err:
        return [Document(source, 0, error=ConfigError(f"cannot read file: {err.strerror or err}"))]
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return [Document(source, 0, error=ConfigError("file is not UTF-8 text"))]
    return parse_text(text, source, json=path.suffix == ".json", limits=limits)


def _read_bounded(path: Path, max_bytes: int) -> bytes:
    """The file's bytes; LimitExceeded if it is larger than ``max_bytes`` or not a regular file.

    The size is checked before reading and the read stops after the limit: a
    file may grow meanwhile, and a link to /dev/zero has size 0 and no end.
    """
    with open(path, "rb", opener=_open_nonblocking) as f:
        mode = os.fstat(f.fileno()).st_mode
        if not stat.S_ISREG(mode):
            raise LimitExceeded("not a regular file")
        size = os.fstat(f.fileno()).st_size
        if size > max_bytes:
            raise LimitExceeded(f"file is {size:,} bytes, over the limit of {max_bytes:,} bytes")
        raw = f.read(max_bytes + 1)
    if len(raw) > max_bytes:
        raise LimitExceeded(f"file is over the limit of {max_bytes:,} bytes")
    return raw


def _open_nonblocking(path: str, flags: int) -> int:
    # Opening a FIFO for reading blocks until a writer comes; with O_NONBLOCK it returns at once
    # and the regular-file check rejects it.
    return os.open(path, flags | os.O_NONBLOCK)


def _too_many(source: str, limits: FileLimits) -> Document:
    reason = f"more than the limit of {limits.max_documents:,} documents"
    return Document(source, WHOLE_FILE, error=LimitExceeded(reason))


def _checked(data: Any, source: str, index: int, limits: FileLimits) -> list[Document]:
    try:
        check_value(data, limits)
    except LimitExceeded as err:
        return [Document(source, index, error=err)]
    return _expand(data, source, index)


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
