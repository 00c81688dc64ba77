"""One config file read and decoded into objects: the work that may run in another process.

``load_file`` is a pure function of the file, the limits and the default
namespace, and its result is plain picklable data, so the config directory
can run it in a loader process (``loader_process``) and apply the result on
the event loop. ``InlineLoader`` runs it in the caller's thread, for tools and
tests.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from meshpilot.config.decode import Decoded, decode_object, identify
from meshpilot.config.documents import Document, read_file
from meshpilot.config.errors import ConfigError
from meshpilot.config.file_limits import DEFAULT_LIMITS, FileLimits
from meshpilot.config.schemas import SCHEMAS, lookup
from meshpilot.model.kind import Kind

log = logging.getLogger(__name__)

ObjectKey = tuple[Kind, str, str]  # kind, namespace, name


@dataclass(frozen=True, slots=True)
class Rejection:
    """An object (or document, or whole file) that was not applied, and why."""

    where: str
    object: str
    reason: str


@dataclass(frozen=True, slots=True)
class LoadedDocument:
    """One document of a file, decoded or rejected.

    ``key`` is set whenever the document names an object, also when it is
    rejected: the file source then keeps that object's last valid version.
    ``key`` None with a rejection means the document could not even be
    identified.
    """

    where: str
    key: ObjectKey | None
    obj: Decoded | None = None
    rejection: Rejection | None = None
    warnings: tuple[str, ...] = ()


class FileLoader(Protocol):
    """Reads and decodes one file; never raises for what the file holds."""

    async def load(self, path: Path) -> list[LoadedDocument]: ...

    async def close(self) -> None:
        """Stop any work in progress and release what the loader holds (a process)."""
        ...


def object_key(obj: Decoded) -> ObjectKey:
    return (obj.kind, obj.meta.namespace, obj.meta.name)


def describe(key: ObjectKey) -> str:
    kind, namespace, name = key
    return f"{kind.value} {namespace}/{name}" if namespace else f"{kind.value} {name}"


def load_file(
    path: Path, limits: FileLimits = DEFAULT_LIMITS, default_namespace: str = "default"
) -> list[LoadedDocument]:
    """Every document of ``path``, decoded and validated, or rejected with the reason."""
    return [_decode(doc, default_namespace) for doc in read_file(path, limits)]


def _decode(doc: Document, default_namespace: str) -> LoadedDocument:
    if doc.error is not None or doc.raw is None:
        error = doc.error or ConfigError("empty document")
        what = "file" if doc.where == doc.source else "document"
        return LoadedDocument(doc.where, None, rejection=Rejection(doc.where, what, error.args[0]))
    kind_text, namespace, name = identify(doc.raw)
    key: ObjectKey | None = None
    try:
        kind = lookup(str(doc.raw.get("apiVersion", "")), kind_text).kind
        if name:
            key = (kind, namespace or ("" if SCHEMAS[kind].cluster_scoped else default_namespace), name)
    except ConfigError:
        pass
    described = f"{kind_text or 'object'} {namespace + '/' if namespace else ''}{name}".strip()
    try:
        result = decode_object(doc.raw, default_namespace=default_namespace)
    except ConfigError as err:
        return LoadedDocument(doc.where, key, rejection=Rejection(doc.where, described, err.args[0]))
    except RecursionError:  # a safety net: documents.check_value bounds nesting first
        reason = "nested too deep to decode"
        return LoadedDocument(doc.where, key, rejection=Rejection(doc.where, described, reason))
    warnings = tuple(f"{described}: {warning}" for warning in result.warnings)
    return LoadedDocument(doc.where, object_key(result.obj), obj=result.obj, warnings=warnings)


class InlineLoader:
    """Loads in the calling thread: no time limit, for tools, tests and ``FileSource.sync``."""

    def __init__(self, limits: FileLimits = DEFAULT_LIMITS, default_namespace: str = "default") -> None:
        self.limits = limits
        self.default_namespace = default_namespace

    def load_now(self, path: Path) -> list[LoadedDocument]:
        return load_file(path, self.limits, self.default_namespace)

    async def load(self, path: Path) -> list[LoadedDocument]:
        return self.load_now(path)

    async def close(self) -> None:
        return None
