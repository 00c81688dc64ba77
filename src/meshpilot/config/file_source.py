"""The config directory: every YAML and JSON file under it, loaded and watched.

Each file owns the objects it defines. When a file changes it is read again
and only the objects whose content changed reach the sink. A document that
cannot be read or is invalid is logged with its file, document index and
reason, and is not applied; the last valid version of that object (if any)
stays in place, so a typo never takes config away from proxies.

If two files define the same object, the file whose path sorts first wins
and the other definition is reported.

While serving (``refresh``, ``run``) files are read and decoded by a
``FileLoader``, by default a child process (``loader_process``) with the
limits of ``FileLimits``: the event loop only applies decoded objects, in
slices, so no file stalls pushes or probes. A file over a limit is rejected
as a whole and what it defined before stays. The directory is walked
following symlinks (Kubernetes mounts ConfigMaps through them), each real
directory once, so links that loop are walked once.

All the files changed in one edit are applied together, in one sink batch,
after every one of them was loaded: an object moved from one file to another
goes straight from its old definition to its new one and is never missing
from the sink (a DENY policy missing for the time a large file takes to load
fails open), and derived state is computed once per edit, not once per file.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Iterable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import watchfiles

from meshpilot.config.decode import Decoded
from meshpilot.config.documents import CONFIG_SUFFIXES
from meshpilot.config.file_limits import DEFAULT_LIMITS, FileLimits
from meshpilot.config.file_loader import (
    FileLoader,
    InlineLoader,
    LoadedDocument,
    ObjectKey,
    Rejection,
    describe,
    object_key,
)
from meshpilot.config.loader_process import ProcessLoader
from meshpilot.model.kind import Kind

log = logging.getLogger(__name__)

__all__ = ["FileSource", "ObjectKey", "ObjectSink", "Rejection", "config_files", "object_key"]

Signature = tuple[int, int, int]  # mtime_ns, size, inode

#: Objects applied between two yields to the event loop while a change is applied.
_SLICE = 256


class ObjectSink(Protocol):
    """Where decoded objects go: the config store and the Kubernetes registry."""

    def upsert(self, obj: Decoded) -> None: ...

    def remove(self, kind: Kind, namespace: str, name: str) -> None: ...

    def batch(self) -> AbstractContextManager[None]:
        """Group the changes of one sync: derived state (endpoints) is computed once, at the end."""
        ...


@dataclass(slots=True)
class _FileState:
    signature: Signature
    objects: dict[ObjectKey, Decoded]
    rejections: list[Rejection]


class FileSource:
    """Loads a directory tree of config files into a sink and keeps it in sync."""

    def __init__(
        self,
        root: Path,
        sink: ObjectSink,
        *,
        default_namespace: str = "default",
        limits: FileLimits = DEFAULT_LIMITS,
        loader: FileLoader | None = None,
    ) -> None:
        self.root = root
        self._sink = sink
        self._default_namespace = default_namespace
        self.limits = limits
        #: Loads for ``refresh`` and ``run``; ``sync`` loads in the caller's thread.
        self.loader: FileLoader = loader or ProcessLoader(limits, default_namespace)
        self._inline = InlineLoader(limits, default_namespace)
        self._files: dict[Path, _FileState] = {}
        #: The files defining each object, so settling a key does not visit every file.
        self._defined_in: dict[ObjectKey, set[Path]] = {}
        self._effective: dict[ObjectKey, tuple[Path, Decoded]] = {}
        #: Keys whose definitions were recorded but not yet settled into the sink: settled at the
        #: end of the same refresh, or by the next one if this one was cancelled or failed midway.
        self._unsettled: set[ObjectKey] = set()
        self._lock = asyncio.Lock()

    @property
    def rejections(self) -> list[Rejection]:
        """Everything currently rejected, for the debug endpoints."""
        return [r for state in self._files.values() for r in state.rejections]

    def object_count(self) -> int:
        return len(self._effective)

    def sync(self) -> bool:
        """Read every new or changed file in this thread and apply the differences; True if any.

        For tools and tests: a server uses ``refresh``, which keeps files off its event loop.
        """
        found = dict(self._scan())
        changed = self._changed(found)
        if not changed and not self._unsettled:
            return False
        loaded = {path: self._inline.load_now(path) for path in sorted(changed) if path in found}
        for path in sorted(changed):
            self._take(path, found, loaded)
        with self._sink.batch():
            for key in self._settle_order():
                self._settle(key)
        return True

    async def refresh(self) -> bool:
        """``sync`` for a server: the walk on a thread, files through the loader, the objects
        applied a slice at a time; True if anything changed.

        Every changed file is loaded before any is applied, and then all of them are applied in
        one sink batch. An edit that moves an object between files therefore never removes it
        first, and a small file changed with a large one waits for it (at most the loader's time
        limit per file). A stop while files load (the task cancelled) leaves everything as it was.
        """
        async with self._lock:
            found = dict(await asyncio.to_thread(lambda: list(self._scan())))
            changed = self._changed(found)
            if not changed and not self._unsettled:
                return False
            loaded: dict[Path, list[LoadedDocument]] = {}
            for path in sorted(changed):
                if path in found:
                    loaded[path] = await self.loader.load(path)
            for path in sorted(changed):
                self._take(path, found, loaded)
                await asyncio.sleep(0)  # a file of many documents is recorded between yields
            with self._sink.batch():
                for i, key in enumerate(self._settle_order()):
                    self._settle(key)
                    if i % _SLICE == _SLICE - 1:
                        await asyncio.sleep(0)
            return True

    async def run(self, stop: asyncio.Event) -> None:
        """Watch the directory and refresh on every change until ``stop`` is set."""
        async for _ in watchfiles.awatch(
            self.root, stop_event=stop, debounce=50, step=25, recursive=True, ignore_permission_denied=True
        ):
            try:
                await self.refresh()
            except Exception:  # a bug here must not stop watching
                log.exception("config directory %s: sync failed", self.root)

    async def close(self) -> None:
        """Stop the loader (a file being read is abandoned)."""
        await self.loader.close()

    # -- internals -----------------------------------------------------------

    def _scan(self) -> Iterable[tuple[Path, Signature]]:
        for path in config_files(self.root):
            try:
                st = path.stat()
            except OSError:
                continue
            yield path, (st.st_mtime_ns, st.st_size, st.st_ino)

    def _changed(self, found: Mapping[Path, Signature]) -> set[Path]:
        changed = set(self._files) - set(found)
        for path, signature in found.items():
            state = self._files.get(path)
            if state is None or state.signature != signature:
                changed.add(path)
        return changed

    def _take(
        self, path: Path, found: Mapping[Path, Signature], loaded: Mapping[Path, list[LoadedDocument]]
    ) -> None:
        """Record the new state of ``path`` (gone if not in ``found``); its keys become unsettled."""
        old = self._files.pop(path, None)
        if old is not None:
            self._unsettled.update(old.objects)
            for key in old.objects:
                self._defined_in[key].discard(path)
        if path not in found:
            log.info("config file %s removed", path)
            return
        state = self._read(found[path], loaded[path], old)
        self._files[path] = state
        self._unsettled.update(state.objects)
        for key in state.objects:
            self._defined_in.setdefault(key, set()).add(path)

    def _settle_order(self) -> list[ObjectKey]:
        return sorted(self._unsettled, key=lambda k: (k[0].value, k[1], k[2]))

    def _read(self, signature: Signature, docs: list[LoadedDocument], old: _FileState | None) -> _FileState:
        previous = old.objects if old is not None else {}
        objects: dict[ObjectKey, Decoded] = {}
        rejections: list[Rejection] = []
        unreadable = False
        for doc in docs:
            key, obj, rejection = doc.key, doc.obj, doc.rejection
            if rejection is not None:
                rejections.append(rejection)
                log.error("config %s: %s rejected: %s", rejection.where, rejection.object, rejection.reason)
            for warning in doc.warnings:
                log.warning("config %s: %s", doc.where, warning)
            if obj is not None and key is not None:
                if key in objects:
                    reason = "defined twice in the same file; the first definition is used"
                    rejections.append(Rejection(doc.where, describe(key), reason))
                    log.error("config %s: %s %s", doc.where, describe(key), reason)
                    continue
                objects[key] = obj
            elif key is not None and key in previous and key not in objects:
                objects[key] = previous[key]
                log.warning("config %s: keeping the last valid version of %s", doc.where, describe(key))
            elif key is None:
                unreadable = True
        if unreadable:
            # Documents that could not even be identified (or a file rejected whole) may be the
            # ones that held the objects this file used to define: keep those.
            for key, obj in previous.items():
                if key not in objects:
                    objects[key] = obj
        return _FileState(signature, objects, rejections)

    def _settle(self, key: ObjectKey) -> None:
        """Make the sink hold the winning definition of ``key``, or nothing."""
        self._unsettled.discard(key)
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
            log.error("config %s: %s is also defined in %s, which wins", other, describe(key), path)
        if current is None or current[1] != obj:
            self._effective[key] = (path, obj)
            self._sink.upsert(obj)
        elif current[0] != path:
            self._effective[key] = (path, obj)


def config_files(root: Path) -> Iterable[Path]:
    """The YAML and JSON files under ``root``, in sorted order.

    Hidden entries are skipped: Kubernetes ConfigMap volumes keep the real
    files in "..data"-style directories behind visible symlinks. Directory
    symlinks are followed, but each real directory is walked once: links that
    point back up the tree (two links to "." grew the walk without end) are
    skipped.
    """
    seen: set[tuple[int, int]] = set()
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        try:
            st = os.stat(dirpath)
        except OSError:
            dirnames[:] = []
            continue
        if (st.st_dev, st.st_ino) in seen:
            dirnames[:] = []
            continue
        seen.add((st.st_dev, st.st_ino))
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in sorted(filenames):
            if not name.startswith(".") and name.endswith(CONFIG_SUFFIXES):
                yield Path(dirpath, name)
