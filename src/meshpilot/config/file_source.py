"""The config directory: every YAML and JSON file under it, loaded and watched.

Each file owns the objects it defines. When a file changes it is read again
and only the objects whose content changed reach the sink. A document that
cannot be read or is invalid is logged with its file, document index and
reason, and is not applied; the last valid version of that object (if any)
stays in place, so a typo never takes config away from proxies.

If two files define the same object, the file whose path sorts first wins
and the other definition is reported.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import watchfiles

from meshpilot.config.decode import Decoded, decode_object, identify
from meshpilot.config.documents import CONFIG_SUFFIXES, Document, read_file
from meshpilot.config.errors import ConfigError
from meshpilot.config.schemas import SCHEMAS, lookup
from meshpilot.model.kind import Kind

log = logging.getLogger(__name__)

ObjectKey = tuple[Kind, str, str]  # kind, namespace, name


class ObjectSink(Protocol):
    """Where decoded objects go: the config store and the Kubernetes registry."""

    def upsert(self, obj: Decoded) -> None: ...

    def remove(self, kind: Kind, namespace: str, name: str) -> None: ...

    def batch(self) -> AbstractContextManager[None]:
        """Group the changes of one sync: derived state (endpoints) is computed once, at the end."""
        ...


@dataclass(frozen=True, slots=True)
class Rejection:
    """An object (or document) that was not applied, and why."""

    where: str
    object: str
    reason: str


def object_key(obj: Decoded) -> ObjectKey:
    return (obj.kind, obj.meta.namespace, obj.meta.name)


@dataclass(slots=True)
class _FileState:
    signature: tuple[int, int, int]
    objects: dict[ObjectKey, Decoded]
    rejections: list[Rejection]


class FileSource:
    """Loads a directory tree of config files into a sink and keeps it in sync."""

    def __init__(self, root: Path, sink: ObjectSink, *, default_namespace: str = "default") -> None:
        self.root = root
        self._sink = sink
        self._default_namespace = default_namespace
        self._files: dict[Path, _FileState] = {}
        #: The files defining each object, so settling a key does not visit every file.
        self._defined_in: dict[ObjectKey, set[Path]] = {}
        self._effective: dict[ObjectKey, tuple[Path, Decoded]] = {}

    @property
    def rejections(self) -> list[Rejection]:
        """Everything currently rejected, for the debug endpoints."""
        return [r for state in self._files.values() for r in state.rejections]

    def object_count(self) -> int:
        return len(self._effective)

    def sync(self) -> bool:
        """Read every new or changed file and apply the differences; True if any."""
        found = dict(self._scan())
        changed: set[Path] = set()
        for path in set(self._files) - set(found):
            changed.add(path)
        for path, signature in found.items():
            state = self._files.get(path)
            if state is None or state.signature != signature:
                changed.add(path)
        if not changed:
            return False
        self._reload(changed, found)
        return True

    async def run(self, stop: asyncio.Event) -> None:
        """Watch the directory and sync on every change until ``stop`` is set."""
        async for _ in watchfiles.awatch(
            self.root, stop_event=stop, debounce=50, step=25, recursive=True, ignore_permission_denied=True
        ):
            try:
                self.sync()
            except Exception:  # a bug here must not stop watching
                log.exception("config directory %s: sync failed", self.root)

    # -- internals -----------------------------------------------------------

    def _scan(self) -> Iterable[tuple[Path, tuple[int, int, int]]]:
        for path in config_files(self.root):
            try:
                st = path.stat()
            except OSError:
                continue
            yield path, (st.st_mtime_ns, st.st_size, st.st_ino)

    def _reload(self, paths: set[Path], found: dict[Path, tuple[int, int, int]]) -> None:
        touched: set[ObjectKey] = set()
        for path in sorted(paths):
            old = self._files.pop(path, None)
            if old is not None:
                touched.update(old.objects)
                for key in old.objects:
                    self._defined_in[key].discard(path)
            if path not in found:
                log.info("config file %s removed", path)
                continue
            state = self._read(path, found[path], old)
            self._files[path] = state
            touched.update(state.objects)
            for key in state.objects:
                self._defined_in.setdefault(key, set()).add(path)
        with self._sink.batch():
            for key in sorted(touched, key=lambda k: (k[0].value, k[1], k[2])):
                self._settle(key)

    def _read(self, path: Path, signature: tuple[int, int, int], old: _FileState | None) -> _FileState:
        previous = old.objects if old is not None else {}
        objects: dict[ObjectKey, Decoded] = {}
        rejections: list[Rejection] = []
        unreadable = False
        for doc in read_file(path):
            key, obj, rejection = self._decode(doc)
            if rejection is not None:
                rejections.append(rejection)
                log.error("config %s: %s rejected: %s", rejection.where, rejection.object, rejection.reason)
            if obj is not None and key is not None:
                if key in objects:
                    reason = "defined twice in the same file; the first definition is used"
                    rejections.append(Rejection(doc.where, _describe(key), reason))
                    log.error("config %s: %s %s", doc.where, _describe(key), reason)
                    continue
                objects[key] = obj
            elif key is not None and key in previous and key not in objects:
                objects[key] = previous[key]
                log.warning("config %s: keeping the last valid version of %s", doc.where, _describe(key))
            elif key is None:
                unreadable = True
        if unreadable:
            # Documents that could not even be identified may be the ones that
            # held the objects this file used to define: keep those.
            for key, obj in previous.items():
                if key not in objects:
                    objects[key] = obj
        return _FileState(signature, objects, rejections)

    def _decode(self, doc: Document) -> tuple[ObjectKey | None, Decoded | None, Rejection | None]:
        if doc.error is not None or doc.raw is None:
            error = doc.error or ConfigError("empty document")
            return None, None, Rejection(doc.where, "document", error.args[0])
        kind_text, namespace, name = identify(doc.raw)
        key: ObjectKey | None = None
        try:
            kind = lookup(str(doc.raw.get("apiVersion", "")), kind_text).kind
            if name:
                key = (kind, namespace or self._namespace_for(kind), name)
        except ConfigError:
            pass
        described = f"{kind_text or 'object'} {namespace + '/' if namespace else ''}{name}".strip()
        try:
            result = decode_object(doc.raw, default_namespace=self._default_namespace)
        except ConfigError as err:
            return key, None, Rejection(doc.where, described, err.args[0])
        for warning in result.warnings:
            log.warning("config %s: %s: %s", doc.where, described, warning)
        return object_key(result.obj), result.obj, None

    def _namespace_for(self, kind: Kind) -> str:
        return "" if SCHEMAS[kind].cluster_scoped else self._default_namespace

    def _settle(self, key: ObjectKey) -> None:
        """Make the sink hold the winning definition of ``key``, or nothing."""
        paths = self._defined_in.get(key, set())
        definitions = sorted((path, self._files[path].objects[key]) for path in paths)
        if not paths:
            self._defined_in.pop(key, None)
        current = self._effective.get(key)
        if not definitions:
            if current is not None:
                del self._effective[key]
                self._sink.remove(*key)
            return
        path, obj = definitions[0]
        for other, _ in definitions[1:]:
            log.error("config %s: %s is also defined in %s, which wins", other, _describe(key), path)
        if current is None or current[1] != obj:
            self._effective[key] = (path, obj)
            self._sink.upsert(obj)
        elif current[0] != path:
            self._effective[key] = (path, obj)


def config_files(root: Path) -> Iterable[Path]:
    """The YAML and JSON files under ``root``, in sorted order.

    Hidden entries are skipped: Kubernetes ConfigMap volumes keep the real
    files in "..data"-style directories behind visible symlinks.
    """
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in sorted(filenames):
            if not name.startswith(".") and name.endswith(CONFIG_SUFFIXES):
                yield Path(dirpath, name)


def _describe(key: ObjectKey) -> str:
    kind, namespace, name = key
    return f"{kind.value} {namespace}/{name}" if namespace else f"{kind.value} {name}"
