"""List-then-watch of one Kubernetes resource, on its own thread.

The official client is synchronous, so each informer blocks a thread on its
watch stream and hands what it sees to the event loop through a
:class:`Pump`. It behaves as client-go's reflector:

* the first list (in pages) gives the full state and a resourceVersion;
* the watch resumes from the newest resourceVersion seen, also after the
  connection drops, so nothing is missed and nothing is repeated;
* ``410 Gone`` (the version was compacted away) relists, and the relist is
  compared with what was known, so objects deleted meanwhile are reported
  as deleted;
* any other failure retries with exponential backoff while the last known
  state keeps serving;
* a resource the server does not have (a CRD that is not installed) counts as
  empty, is reported once, and is looked for again later.

Objects are decoded on the informer's thread, so the loop only applies them.
"""

from __future__ import annotations

import contextlib
import logging
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import orjson
import urllib3
from kubernetes import client as kclient
from kubernetes.watch.watch import iter_resp_lines

from meshpilot.config.errors import ConfigError
from meshpilot.kube.client import KubeError, open_request, request_json, resource_path

log = logging.getLogger(__name__)

T = TypeVar("T")
ObjectName = tuple[str, str]  # namespace, name

#: Server-side watch timeout range; jittered so informers do not reconnect in step (client-go: 5-10 min).
WATCH_TIMEOUT = (300, 600)
_BACKOFF_FIRST = 0.2
_BACKOFF_MAX = 30.0
_MISSING_RETRY = 30.0


@dataclass(frozen=True, slots=True)
class Resource:
    """What to list and watch: a resource of the API, optionally narrowed by namespace and selectors."""

    group: str
    version: str
    plural: str
    kind: str
    namespace: str = ""
    label_selector: str = ""
    field_selector: str = ""

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def path(self) -> str:
        return resource_path(self.group, self.version, self.plural, self.namespace)

    def __str__(self) -> str:
        where = f" in {self.namespace}" if self.namespace else ""
        return f"{self.plural}.{self.group or 'core'}/{self.version}{where}"


@dataclass(frozen=True, slots=True)
class Change(Generic[T]):
    """One object seen: ``obj`` is None when it was deleted or could not be decoded (``error``)."""

    name: ObjectName
    obj: T | None
    deleted: bool = False
    error: str = ""


@dataclass(frozen=True, slots=True)
class Delivery(Generic[T]):
    """What an informer hands to the loop at once: one watch event, or a whole (re)list."""

    informer: Informer[T]
    changes: list[Change[T]]
    #: A list: ``changes`` is the complete state (deletions of what went missing included).
    listed: bool = False


class Pump:
    """Hands deliveries from informer threads to one callback on the loop, as batches.

    A burst of events becomes one call, so the registry computes derived state
    (endpoints) once for the burst.
    """

    def __init__(self, loop: Any, apply: Callable[[list[Delivery[Any]]], None]) -> None:
        self._loop = loop
        self._apply = apply
        self._lock = threading.Lock()
        self._pending: list[Delivery[Any]] = []

    def put(self, delivery: Delivery[Any]) -> None:
        with self._lock:
            first = not self._pending
            self._pending.append(delivery)
        if first:
            # A closed loop means shutdown: the delivery no longer matters.
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._drain)

    def _drain(self) -> None:
        with self._lock:
            batch, self._pending = self._pending, []
        if batch:
            self._apply(batch)


class Expired(Exception):
    """The resourceVersion to resume from is gone (410): list again."""


class Informer(Generic[T]):
    """Keeps one resource's objects flowing to a Pump until stopped."""

    def __init__(
        self,
        api: kclient.ApiClient,
        resource: Resource,
        decode: Callable[[dict[str, Any]], T],
        pump: Pump,
        *,
        cluster: str = "",
        page_size: int = 500,
        watch_timeout: tuple[int, int] | None = None,
    ) -> None:
        self.api = api
        self.resource = resource
        self.cluster = cluster
        self._decode = decode
        self._pump = pump
        self._page_size = page_size
        self._watch_timeout = watch_timeout or WATCH_TIMEOUT
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._response: urllib3.BaseHTTPResponse | None = None
        self._response_lock = threading.Lock()
        #: resourceVersion of every object known, to tell a relist's deletions and skip repeats.
        self._known: dict[ObjectName, str] = {}
        #: Set by the consumer when the first list was applied.
        self.synced = False
        #: Counters for tests and debug: lists done (first and re-), watches opened.
        self.lists = 0
        self.watches = 0

    def __repr__(self) -> str:
        return f"Informer({self.resource}{', cluster ' + self.cluster if self.cluster else ''})"

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"informer {self.resource}", daemon=True)
        self._thread.start()

    def request_stop(self) -> None:
        """Tell the thread to end and unblock its read of the watch stream; see ``join``."""
        self._stop.set()
        with self._response_lock:
            if self._response is not None:
                # shutdown() (urllib3 2.3+) interrupts a read blocked in another thread.
                shutdown = getattr(self._response, "shutdown", None)
                try:
                    if shutdown is not None:
                        shutdown()
                    else:
                        self._response.close()
                except (OSError, ValueError, RuntimeError):
                    # The thread closed the stream at the same moment (the API server went away,
                    # a watch timed out): its socket is gone, so there is no read left to unblock.
                    pass

    def join(self, timeout: float = 5.0) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def stop(self, timeout: float = 5.0) -> None:
        self.request_stop()
        self.join(timeout)

    # -- the thread -------------------------------------------------------------

    def _run(self) -> None:
        version = ""
        delay = _BACKOFF_FIRST
        failing = False
        while not self._stop.is_set():
            try:
                if not version:
                    version = self._list()
                version = self._watch(version)
                delay = _BACKOFF_FIRST
                if failing:
                    log.info("kube %s: watching again", self._where())
                    failing = False
            except Expired:
                log.info("kube %s: resourceVersion %s expired; listing again", self._where(), version)
                version = ""
            except _Missing:
                version = ""
                self._stop.wait(_MISSING_RETRY)
            except Exception as err:  # any failure: keep the last state and retry
                if self._stop.is_set():
                    break
                if not failing:
                    log.warning("kube %s: %s; retrying, serving the last known state", self._where(), err)
                    failing = True
                else:
                    log.debug("kube %s: %s", self._where(), err)
                self._stop.wait(delay * random.uniform(0.8, 1.2))
                delay = min(delay * 2, _BACKOFF_MAX)

    def _where(self) -> str:
        return f"{self.resource}" + (f" (cluster {self.cluster})" if self.cluster else "")

    def _query(self) -> list[tuple[str, Any]]:
        query: list[tuple[str, Any]] = []
        if self.resource.label_selector:
            query.append(("labelSelector", self.resource.label_selector))
        if self.resource.field_selector:
            query.append(("fieldSelector", self.resource.field_selector))
        return query

    def _list(self) -> str:
        """List everything (in pages) and deliver it as the complete state; returns the list's version."""
        items: list[dict[str, Any]] = []
        token = ""
        while True:
            query = [*self._query(), ("limit", self._page_size)]
            if token:
                query.append(("continue", token))
            try:
                page = request_json(self.api, "GET", self.resource.path, query=query)
            except KubeError as err:
                if err.status == 404:
                    self._missing()
                if err.status == 410 and token:
                    # The continue token expired mid-list: start over for a consistent snapshot.
                    items, token = [], ""
                    continue
                raise
            if not isinstance(page, dict):
                raise KubeError(f"list {self.resource}: not a list object")
            items.extend(item for item in page.get("items") or [] if isinstance(item, dict))
            meta = page.get("metadata") or {}
            token = str(meta.get("continue") or "")
            if not token:
                version = str(meta.get("resourceVersion") or "")
                break
        self.lists += 1
        changes: list[Change[T]] = []
        seen: dict[ObjectName, str] = {}
        for item in items:
            # List items carry no apiVersion/kind: the list does.
            item.setdefault("apiVersion", self.resource.api_version)
            item.setdefault("kind", self.resource.kind)
            name, object_version = _identity(item)
            seen[name] = object_version
            if self._known.get(name) != object_version or not object_version:
                changes.append(self._decoded(name, item))
        for name in self._known.keys() - seen.keys():
            changes.append(Change(name, None, deleted=True))
        self._known = seen
        self._pump.put(Delivery(self, changes, listed=True))
        return version

    def _missing(self) -> None:
        if self.lists == 0 and not self._known:
            log.warning(
                "kube %s: not served by the API server (CRD not installed?); treated as empty", self._where()
            )
        changes: list[Change[T]] = [Change(name, None, deleted=True) for name in self._known]
        self._known = {}
        self.lists += 1
        self._pump.put(Delivery(self, changes, listed=True))
        raise _Missing

    def _watch(self, version: str) -> str:
        """Follow changes after ``version`` until the server ends the stream; returns the newest version."""
        timeout = random.randint(*self._watch_timeout)
        query = [
            *self._query(),
            ("watch", "true"),
            ("resourceVersion", version),
            ("allowWatchBookmarks", "true"),
            ("timeoutSeconds", timeout),
        ]
        try:
            response = open_request(
                self.api, "GET", self.resource.path, query=query, timeout=(5.0, timeout + 30.0)
            )
        except KubeError as err:
            # Some servers refuse a compacted resourceVersion with the status itself, not an event.
            if err.status == 410:
                raise Expired from None
            raise
        with self._response_lock:
            if self._stop.is_set():
                response.release_conn()
                return version
            self._response = response
        self.watches += 1
        try:
            for line in iter_resp_lines(response):  # type: ignore[no-untyped-call]
                if self._stop.is_set():
                    break
                version = self._event(line, version)
        except (urllib3.exceptions.HTTPError, OSError) as err:
            if not self._stop.is_set():
                raise KubeError(f"watch {self.resource}: {err}") from None
        finally:
            with self._response_lock:
                self._response = None
            response.release_conn()
        return version

    def _event(self, line: str, version: str) -> str:
        try:
            event = orjson.loads(line)
        except orjson.JSONDecodeError as err:
            raise KubeError(f"watch {self.resource}: undecodable event: {err}") from None
        kind = event.get("type")
        obj = event.get("object")
        if not isinstance(obj, dict):
            raise KubeError(f"watch {self.resource}: event without an object")
        if kind == "ERROR":
            if obj.get("code") == 410:
                raise Expired
            raise KubeError(
                f"watch {self.resource}: {obj.get('code')} {obj.get('message', '')}",
                int(obj.get("code") or 0),
            )
        name, object_version = _identity(obj)
        if kind == "BOOKMARK":
            return object_version or version
        obj.setdefault("apiVersion", self.resource.api_version)
        obj.setdefault("kind", self.resource.kind)
        if kind == "DELETED":
            if self._known.pop(name, None) is not None:
                self._pump.put(Delivery(self, [Change(name, None, deleted=True)]))
        elif kind in ("ADDED", "MODIFIED"):
            if self._known.get(name) != object_version or not object_version:
                self._known[name] = object_version
                self._pump.put(Delivery(self, [self._decoded(name, obj)]))
        else:
            log.debug("kube %s: ignoring watch event type %r", self._where(), kind)
        return object_version or version

    def _decoded(self, name: ObjectName, raw: dict[str, Any]) -> Change[T]:
        try:
            return Change(name, self._decode(raw))
        except ConfigError as err:
            return Change(name, None, error=str(err))
        except Exception as err:  # a decoder bug must not stop the informer
            log.exception("kube %s: cannot decode %s/%s", self._where(), *name)
            return Change(name, None, error=f"internal error: {err}")


class _Missing(Exception):
    """The resource is not served; it was reported as empty."""


def _identity(obj: dict[str, Any]) -> tuple[ObjectName, str]:
    meta = obj.get("metadata")
    meta = meta if isinstance(meta, dict) else {}
    return (str(meta.get("namespace") or ""), str(meta.get("name") or "")), str(
        meta.get("resourceVersion") or ""
    )
