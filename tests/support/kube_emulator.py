"""An in-memory kube-apiserver with the semantics informers and leader election rely on.

``KubeApiEmulator`` extends kmock's ``KubernetesEmulator`` (which keeps discovery, ``/version``
and the request log) and takes over the object endpoints of the resources in ``RESOURCES``:

- one cluster-wide resourceVersion counter; every write stamps ``metadata.resourceVersion``;
- a bounded event history per resource, so a watch resumes from a resourceVersion, and answers
  ``ERROR 410 Expired`` in the stream when that version is older than the history (or compacted);
- label and field selectors on list and watch; an object that stops matching a watcher's
  selector is sent to it as DELETED, one that starts matching as ADDED;
- 409 AlreadyExists on create, 409 Conflict on a PUT or patch with a stale resourceVersion,
  404 NotFound on a missing object, all as ``kind: Status`` bodies.

Every method that touches state runs on the event loop's thread, without awaiting in between,
so the loop is the lock.
"""

from __future__ import annotations

import asyncio
import collections
import copy
import datetime
import json
import uuid
from dataclasses import dataclass, field
from typing import Any

import aiohttp.web
import attrs
import jsonpatch
import kmock
from support.kube_resources import RESOURCES, Obj, ResourceType, StatusError
from support.kube_selectors import Predicate, SelectorError, field_selector, label_selector


@dataclass(frozen=True)
class _Target:
    """What an object URL names: ``/api[s]/GROUP/VERSION[/namespaces/NS]/PLURAL[/NAME]``."""

    rtype: ResourceType
    version: str
    namespace: str | None
    name: str | None
    #: Only ``status`` is served: writes there change the status and nothing else.
    subresource: str | None = None

    @classmethod
    def parse(cls, path: str) -> _Target | None:
        """None for discovery paths; StatusError 404 for resources or subresources not served."""
        parts = path.strip("/").split("/")
        if parts[0] == "api" and len(parts) >= 3:
            group, version, rest = "", parts[1], parts[2:]
        elif parts[0] == "apis" and len(parts) >= 4:
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            return None
        namespace = None
        if len(rest) >= 3 and rest[0] == "namespaces":
            namespace, rest = rest[1], rest[2:]
        for rtype in RESOURCES:
            if (rtype.group, rtype.plural) == (group, rest[0]) and version in rtype.versions:
                if len(rest) == 3 and rest[2] == "status":
                    return cls(rtype, version, namespace, rest[1], "status")
                if len(rest) > 2:  # scale, ...
                    break
                return cls(rtype, version, namespace, rest[1] if len(rest) == 2 else None)
        raise StatusError(404, "NotFound", "the server could not find the requested resource")


@dataclass(frozen=True)
class _Event:
    rv: int
    type: str  # ADDED, MODIFIED or DELETED
    obj: Obj
    old: Obj | None = None  # the state before a MODIFIED


@dataclass(eq=False)
class _Watcher:
    rtype: ResourceType
    matches: Predicate
    bookmarks: bool
    queue: asyncio.Queue[Obj | None] = field(default_factory=asyncio.Queue)

    def translate(self, event: _Event) -> Obj | None:
        """The event as this watcher sees it through its selectors, or None."""
        now = self.matches(event.obj)
        if event.old is not None:
            was = self.matches(event.old)
            if was and not now:
                return {"type": "DELETED", "object": event.obj}
            if now and not was:
                return {"type": "ADDED", "object": event.obj}
        return {"type": event.type, "object": event.obj} if now else None


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch (also used, as an approximation, for strategic merge patches)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = _merge_patch(result.get(key), value)
    return result


Key = tuple[str, str, str, str]  # group, plural, namespace ("" if cluster-scoped), name


@attrs.define(kw_only=True)
class KubeApiEmulator(kmock.KubernetesEmulator):
    """kmock's emulator with real resourceVersions, watch history, selectors and concurrency."""

    history_limit: int = 1000  # events kept per resource for watch resumption

    _rv: int = attrs.field(default=0, init=False)
    _store: dict[Key, Obj] = attrs.field(factory=dict, init=False)
    _history: dict[ResourceType, collections.deque[_Event]] = attrs.field(factory=dict, init=False)
    # A watch may resume from resourceVersion R only if R >= the floor: no event after R was dropped.
    _floors: dict[ResourceType, int] = attrs.field(factory=dict, init=False)
    _compacted_at: int = attrs.field(default=0, init=False)
    _watchers: set[_Watcher] = attrs.field(factory=set, init=False)
    _failures: collections.deque[int] = attrs.field(factory=collections.deque, init=False)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        for rtype in RESOURCES:
            for version in rtype.versions:
                self.resources[f"{rtype.group}/{version}/{rtype.plural}"] = kmock.ResourceInfo(
                    kind=rtype.kind,
                    namespaced=rtype.namespaced,
                    verbs={"get", "list", "watch", "create", "update", "patch", "delete"},
                )

    @property
    def resource_version(self) -> int:
        """The cluster-wide counter: the resourceVersion of the latest write."""
        return self._rv

    # -- State: called on the loop's thread, never awaiting. --

    def get_object(self, rtype: ResourceType, namespace: str, name: str) -> Obj:
        obj = self._store.get(self._key(rtype, namespace, name))
        if obj is None:
            raise StatusError(404, "NotFound", f'{rtype.plural} "{name}" not found', rtype, name)
        return obj

    def list_objects(self, rtype: ResourceType, matches: Predicate | None = None) -> list[Obj]:
        found = [
            obj for (group, plural, _, _), obj in self._store.items() if (group, plural) == self._id(rtype)
        ]
        return [obj for obj in found if matches is None or matches(obj)]

    def create_object(self, rtype: ResourceType, namespace: str, body: Obj) -> Obj:
        obj = copy.deepcopy(body)
        meta = obj.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        name = meta.get("name", "")
        if not name:
            raise StatusError(422, "Invalid", "metadata.name: Required value", rtype)
        key = self._key(rtype, namespace or meta.get("namespace", ""), name)
        if key in self._store:
            raise StatusError(409, "AlreadyExists", f'{rtype.plural} "{name}" already exists', rtype, name)
        if rtype.namespaced:
            meta["namespace"] = key[2]
        meta.update(uid=str(uuid.uuid4()), creationTimestamp=_now(), generation=1)
        obj.setdefault("apiVersion", rtype.api_version())
        obj.setdefault("kind", rtype.kind)
        return self._commit(rtype, key, "ADDED", obj, None)

    def replace_object(self, rtype: ResourceType, namespace: str, name: str, body: Obj) -> Obj:
        old = self.get_object(rtype, namespace, name)
        self._check_version(rtype, old, body)
        obj = copy.deepcopy(body)
        meta = obj.setdefault("metadata", {})
        for kept in ("uid", "creationTimestamp", "generation", "namespace", "name"):
            if kept in old["metadata"]:
                meta[kept] = old["metadata"][kept]
        if obj.get("spec") != old.get("spec"):
            meta["generation"] = old["metadata"].get("generation", 1) + 1
        obj.setdefault("apiVersion", old["apiVersion"])
        obj.setdefault("kind", rtype.kind)
        return self._commit(rtype, self._key(rtype, namespace, name), "MODIFIED", obj, old)

    def patch_object(
        self, rtype: ResourceType, namespace: str, name: str, patch: Any, json_patch: bool
    ) -> Obj:
        old = self.get_object(rtype, namespace, name)
        if json_patch:
            body = jsonpatch.apply_patch(old, patch)
        else:
            self._check_version(rtype, old, patch)
            body = _merge_patch(old, patch)
        body["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"]
        return self.replace_object(rtype, namespace, name, body)

    def write_status(self, rtype: ResourceType, namespace: str, name: str, request: kmock.Request) -> Obj:
        """The status subresource: only ``status`` changes (generation stays, as for a real CRD)."""
        old = self.get_object(rtype, namespace, name)
        sent = _json_object(request.body)
        if request.method.value.upper() == "PUT":
            self._check_version(rtype, old, sent)
            status = sent.get("status")
        else:
            status = _merge_patch(old.get("status"), sent.get("status"))
        body = copy.deepcopy(old)
        if status is None:
            body.pop("status", None)
        else:
            body["status"] = status
        return self.replace_object(rtype, namespace, name, body)

    def delete_object(self, rtype: ResourceType, namespace: str, name: str) -> Obj:
        """Remove at once (finalizers are not honoured); DELETED carries a new resourceVersion."""
        old = self.get_object(rtype, namespace, name)
        return self._commit(rtype, self._key(rtype, namespace, name), "DELETED", copy.deepcopy(old), None)

    def compact(self) -> None:
        """Drop all watch history: resuming from a version older than the current one answers 410 Expired."""
        self._compacted_at = self._rv
        self._history.clear()

    def bookmark(self) -> None:
        """Send a BOOKMARK at the current resourceVersion to watchers that allowed bookmarks."""
        for watcher in self._watchers:
            if watcher.bookmarks:
                rtype = watcher.rtype
                meta = {"resourceVersion": str(self._rv)}
                obj = {"kind": rtype.kind, "apiVersion": rtype.api_version(), "metadata": meta}
                watcher.queue.put_nowait({"type": "BOOKMARK", "object": obj})

    def end_watches(self) -> None:
        """End every open watch stream, as an API server going away does."""
        for watcher in self._watchers:
            watcher.queue.put_nowait(None)

    def fail_next(self, count: int, status: int) -> None:
        """Answer the next ``count`` object requests with ``status`` and a Status body."""
        self._failures.extend([status] * count)

    def carry_over(self, previous: KubeApiEmulator) -> None:
        """Take the objects, counter and history of an emulator that served on an earlier event loop."""
        self._rv, self._store, self._history = previous._rv, previous._store, previous._history
        self._floors, self._compacted_at = previous._floors, previous._compacted_at

    def _commit(self, rtype: ResourceType, key: Key, kind: str, obj: Obj, old: Obj | None) -> Obj:
        self._rv += 1
        obj["metadata"]["resourceVersion"] = str(self._rv)
        if kind == "DELETED":
            del self._store[key]
        else:
            self._store[key] = obj
        history = self._history.setdefault(rtype, collections.deque())
        if len(history) >= self.history_limit:
            self._floors[rtype] = history.popleft().rv
        event = _Event(self._rv, kind, obj, old)
        history.append(event)
        for watcher in self._watchers:
            if watcher.rtype == rtype and (sent := watcher.translate(event)) is not None:
                watcher.queue.put_nowait(sent)
        return obj

    def _check_version(self, rtype: ResourceType, current: Obj, body: Any) -> None:
        wanted = body.get("metadata", {}).get("resourceVersion") if isinstance(body, dict) else None
        if wanted and wanted != current["metadata"]["resourceVersion"]:
            name = current["metadata"]["name"]
            message = (
                f'Operation cannot be fulfilled on {rtype.plural}.{rtype.group} "{name}": '
                "the object has been modified; please apply your changes to the latest version and try again"
            )
            raise StatusError(409, "Conflict", message, rtype, name)

    def _floor(self, rtype: ResourceType) -> int:
        return max(self._floors.get(rtype, 0), self._compacted_at)

    @staticmethod
    def _id(rtype: ResourceType) -> tuple[str, str]:
        return rtype.group, rtype.plural

    @staticmethod
    def _key(rtype: ResourceType, namespace: str, name: str) -> Key:
        return rtype.group, rtype.plural, namespace if rtype.namespaced else "", name

    # -- HTTP --

    async def __call__(self, raw: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        # kmock's path parsing misreads /api/v1/namespaces[/NAME], so object URLs are parsed here.
        try:
            target = _Target.parse(raw.path)
        except StatusError as e:
            return aiohttp.web.json_response(e.status(), status=e.code)
        if target is None:
            return await super().__call__(raw)  # discovery and /version
        body = await raw.read()
        request = kmock.Request(
            id=len(self._requests),
            method=raw.method,
            url=raw.url,
            params=dict(raw.query),
            headers=dict(raw.headers),
            body=body,
            raw_request=raw,
        )
        self._requests.append(request)  # for request_count() and kmock's assertions
        try:
            if self._failures:
                status = self._failures.popleft()
                raise StatusError(status, "InternalError", f"injected failure {status}")
            return await self._serve(request, target)
        except StatusError as e:
            return aiohttp.web.json_response(e.status(), status=e.code)

    async def _serve(self, request: kmock.Request, target: _Target) -> aiohttp.web.StreamResponse:
        rtype, name = target.rtype, target.name
        method, namespace = request.method.value.upper(), target.namespace or ""
        if target.namespace is not None and not rtype.namespaced:
            raise StatusError(404, "NotFound", f"{rtype.plural} is not namespaced", rtype)
        result: Obj
        if target.subresource == "status" and name is not None and method in ("PUT", "PATCH"):
            result = self.write_status(rtype, namespace, name, request)
            return aiohttp.web.json_response(result)
        if method == "GET" and request.params.get("watch") in ("true", "1"):
            return await self._serve_watch_stream(request, target)
        if method == "GET" and name is None:
            items = self.list_objects(rtype, self._predicate(request, target))
            result = {
                "kind": f"{rtype.kind}List",
                "apiVersion": rtype.api_version(target.version),
                "metadata": {"resourceVersion": str(self._rv)},
                "items": sorted(items, key=_version_of),
            }
        elif method == "GET" and name is not None:
            result = self.get_object(rtype, namespace, name)
        elif method == "POST" and name is None:
            result = self.create_object(rtype, namespace, _json_object(request.body))
        elif method == "PUT" and name is not None:
            result = self.replace_object(rtype, namespace, name, _json_object(request.body))
        elif method == "PATCH" and name is not None:
            json_patch = "json-patch" in request.headers.get("Content-Type", "")
            patch = json.loads(request.body) if json_patch else _json_object(request.body)
            result = self.patch_object(rtype, namespace, name, patch, json_patch)
        elif method == "DELETE" and name is not None:
            result = self.delete_object(rtype, namespace, name)
        else:
            raise StatusError(405, "MethodNotAllowed", f"{method} is not supported here", rtype)
        return aiohttp.web.json_response(result, status=201 if method == "POST" else 200)

    @staticmethod
    def _predicate(request: kmock.Request, target: _Target) -> Predicate:
        """Namespace, name and selectors of a list or watch request, as one predicate."""
        checks: list[Predicate] = []
        try:
            if labels := request.params.get("labelSelector"):
                checks.append(label_selector(labels))
            if fields := request.params.get("fieldSelector"):
                checks.append(field_selector(fields))
        except SelectorError as e:
            raise StatusError(400, "BadRequest", str(e)) from None
        if target.namespace is not None:
            checks.append(field_selector(f"metadata.namespace={target.namespace}"))
        if target.name is not None:
            checks.append(field_selector(f"metadata.name={target.name}"))
        return lambda obj: all(check(obj) for check in checks)

    async def _serve_watch_stream(
        self, request: kmock.Request, target: _Target
    ) -> aiohttp.web.StreamResponse:
        params, rtype = request.params, target.rtype
        watcher = _Watcher(
            rtype, self._predicate(request, target), params.get("allowWatchBookmarks") == "true"
        )
        since_text = params.get("resourceVersion", "")
        try:
            since = int(since_text) if since_text not in ("", "0") else None
            timeout = float(params["timeoutSeconds"]) if params.get("timeoutSeconds") else None
        except ValueError:
            raise StatusError(400, "BadRequest", "invalid resourceVersion or timeoutSeconds") from None

        assert request._raw_request is not None
        response = aiohttp.web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request._raw_request)

        # From here to the registration there is no await: no event falls between the two.
        initial: list[Obj | None]
        if since is None:
            objs = sorted(self.list_objects(rtype, watcher.matches), key=_version_of)
            initial = [{"type": "ADDED", "object": obj} for obj in objs]
        elif since < self._floor(rtype):
            expired = StatusError(410, "Expired", f"too old resource version: {since} ({self._floor(rtype)})")
            initial = [{"type": "ERROR", "object": expired.status()}, None]
        else:
            history = self._history.get(rtype, ())
            initial = [sent for event in history if event.rv > since if (sent := watcher.translate(event))]
        for event in initial:
            watcher.queue.put_nowait(event)
        self._watchers.add(watcher)

        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        try:
            while True:
                left = None if deadline is None else deadline - loop.time()
                try:
                    sent = await asyncio.wait_for(watcher.queue.get(), left)
                except TimeoutError:
                    break
                if sent is None:  # the end: 410 sent, or end_watches()
                    break
                await response.write(json.dumps(sent).encode() + b"\n")
        except ConnectionResetError:
            pass  # the client went away
        finally:
            self._watchers.discard(watcher)
        return response


def _version_of(obj: Obj) -> int:
    return int(obj["metadata"]["resourceVersion"])


def _json_object(body: bytes) -> Obj:
    try:
        obj = json.loads(body)
    except ValueError:
        obj = None
    if not isinstance(obj, dict):
        raise StatusError(400, "BadRequest", "the body must be a JSON object")
    return obj
