"""An empty Kubernetes API server for istiod's kube client: ``python -m bench.kube_stub PORT``.

istiod at this version does not start without a Kubernetes client (see ``bench.istiod``), though in
the bench every service and all its config come from files. This server stands for an empty
cluster: every collection lists empty (or holds what istiod itself wrote: its leader-election leases
and config maps), watches stay open and report istiod's own writes, and creates, updates, patches
and deletes behave as the API server's do for one writer. No authentication; plain HTTP on loopback.
It runs in its own process, so none of its CPU is counted as istiod's or the runner's.
"""

from __future__ import annotations

import asyncio
import copy
import datetime
import json
import subprocess
import sys
import time
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonpatch
import yaml
from aiohttp import web

from bench.server import free_port, process_cpu_seconds

ROOT = Path(__file__).resolve().parent.parent

Obj = dict[str, Any]

#: plural -> (Kind, namespaced) of the resources istiod's client reads; others are guessed.
KINDS: dict[str, tuple[str, bool]] = {
    "namespaces": ("Namespace", False),
    "nodes": ("Node", False),
    "pods": ("Pod", True),
    "services": ("Service", True),
    "endpoints": ("Endpoints", True),
    "endpointslices": ("EndpointSlice", True),
    "secrets": ("Secret", True),
    "configmaps": ("ConfigMap", True),
    "serviceaccounts": ("ServiceAccount", True),
    "events": ("Event", True),
    "leases": ("Lease", True),
    "customresourcedefinitions": ("CustomResourceDefinition", False),
    "mutatingwebhookconfigurations": ("MutatingWebhookConfiguration", False),
    "validatingwebhookconfigurations": ("ValidatingWebhookConfiguration", False),
    "ingresses": ("Ingress", True),
    "ingressclasses": ("IngressClass", False),
    "deployments": ("Deployment", True),
    "horizontalpodautoscalers": ("HorizontalPodAutoscaler", True),
    "poddisruptionbudgets": ("PodDisruptionBudget", True),
    "gatewayclasses": ("GatewayClass", False),
    "serviceentries": ("ServiceEntry", True),
    "workloadentries": ("WorkloadEntry", True),
}
VERSION = {"major": "1", "minor": "36", "gitVersion": "v1.36.0", "platform": "linux/amd64"}
INITIAL_EVENTS_END = "k8s.io/initial-events-end"


def kind_of(plural: str) -> tuple[str, bool]:
    if plural in KINDS:
        return KINDS[plural]
    singular = plural[:-2] if plural.endswith("ses") else plural.rstrip("s")
    return singular[:1].upper() + singular[1:], True


@dataclass(frozen=True)
class Target:
    group: str
    version: str
    plural: str
    namespace: str
    name: str
    subresource: str

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def kind(self) -> str:
        return kind_of(self.plural)[0]


def parse(path: str) -> Target | None:
    """``/api/v1[/namespaces/NS]/PLURAL[/NAME[/SUB]]`` or the same under ``/apis/GROUP/VERSION``."""
    parts = [p for p in path.split("/") if p]
    if len(parts) >= 3 and parts[0] == "api":
        group, version, rest = "", parts[1], parts[2:]
    elif len(parts) >= 4 and parts[0] == "apis":
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        return None
    namespace = ""
    if len(rest) >= 3 and rest[0] == "namespaces":
        namespace, rest = rest[1], rest[2:]
    return Target(
        group,
        version,
        rest[0],
        namespace,
        rest[1] if len(rest) > 1 else "",
        rest[2] if len(rest) > 2 else "",
    )


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _status(code: int, reason: str, message: str) -> web.Response:
    body = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    return web.json_response(body, status=code)


def _merge(target: Any, patch: Any) -> Any:
    """RFC 7386 merge patch (also standing for strategic merge and server-side apply)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = _merge(out.get(key), value)
    return out


def _selector_matches(selector: str, values: dict[str, str]) -> bool:
    """Equality, inequality and existence terms; other terms (set-based) are taken as matching."""
    for term in filter(None, (t.strip() for t in selector.split(","))):
        if "!=" in term:
            key, _, value = term.partition("!=")
            if values.get(key.strip()) == value.strip():
                return False
        elif "=" in term:
            key, _, value = term.replace("==", "=").partition("=")
            if values.get(key.strip()) != value.strip():
                return False
        elif term.startswith("!"):
            if term[1:].strip() in values:
                return False
        elif " " not in term and term not in values:
            return False
    return True


def _fields(obj: Obj) -> dict[str, str]:
    meta = obj.get("metadata", {})
    out = {"metadata.name": meta.get("name", ""), "metadata.namespace": meta.get("namespace", "")}
    for key in ("type",):
        if isinstance(obj.get(key), str):
            out[key] = obj[key]
    return out


@dataclass(eq=False)
class Watcher:
    group: str
    plural: str
    namespace: str
    query: dict[str, str]
    metadata_only: bool
    queue: asyncio.Queue[Obj] = field(default_factory=asyncio.Queue)

    def wants(self, obj: Obj) -> bool:
        return _wanted(obj, self.namespace, self.query)


def _wanted(obj: Obj, namespace: str, query: dict[str, str]) -> bool:
    meta = obj.get("metadata", {})
    if namespace and meta.get("namespace") != namespace:
        return False
    if not _selector_matches(query.get("labelSelector", ""), meta.get("labels") or {}):
        return False
    return _selector_matches(query.get("fieldSelector", ""), _fields(obj))


def _metadata_only(obj: Obj) -> Obj:
    return {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": obj["metadata"]}


class EmptyCluster:
    def __init__(self) -> None:
        self.rv = 1
        self.store: dict[tuple[str, str, str, str], Obj] = {}
        self.watchers: set[Watcher] = set()

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 << 20)
        app.router.add_route("*", "/{tail:.*}", self.handle)
        return app

    async def handle(self, request: web.Request) -> web.StreamResponse:
        path = request.path
        if path in ("/version", "/version/"):
            return web.json_response(VERSION)
        if path in ("/healthz", "/readyz", "/livez"):
            return web.Response(text="ok")
        if path == "/api":
            return web.json_response({"kind": "APIVersions", "versions": ["v1"]})
        if path == "/apis":
            return web.json_response({"kind": "APIGroupList", "apiVersion": "v1", "groups": []})
        target = parse(path)
        if target is None:
            return _status(404, "NotFound", f"the server could not find the requested resource ({path})")
        try:
            return await self._serve(request, target)
        except json.JSONDecodeError as err:
            return _status(400, "BadRequest", str(err))

    async def _serve(self, request: web.Request, target: Target) -> web.StreamResponse:
        query = dict(request.query)
        metadata_only = "as=PartialObjectMetadata" in request.headers.get("Accept", "")
        if request.method == "GET" and not target.name:
            if query.get("watch") in ("1", "true"):
                return await self._watch(request, target, query, metadata_only)
            return self._list(target, query, metadata_only)
        if request.method == "GET":
            obj = self.store.get(self._key(target, target.name))
            if obj is None:
                return _status(404, "NotFound", f'{target.plural} "{target.name}" not found')
            return web.json_response(_metadata_only(obj) if metadata_only else obj)
        if request.method == "POST":
            return self._create(target, await request.json())
        if request.method == "DELETE":
            key = self._key(target, target.name)
            if key not in self.store:
                return _status(404, "NotFound", f'{target.plural} "{target.name}" not found')
            obj = self.store.pop(key)
            self._emit(target, "DELETED", obj)
            return web.json_response({"kind": "Status", "apiVersion": "v1", "status": "Success"})
        if request.method in ("PUT", "PATCH"):
            return await self._write(request, target)
        return _status(405, "MethodNotAllowed", request.method)

    def _key(self, target: Target, name: str) -> tuple[str, str, str, str]:
        return (target.group, target.plural, target.namespace, name)

    def _list(self, target: Target, query: dict[str, str], metadata_only: bool) -> web.Response:
        items = [
            obj
            for (group, plural, _, _), obj in self.store.items()
            if (group, plural) == (target.group, target.plural) and _wanted(obj, target.namespace, query)
        ]
        if metadata_only:
            return web.json_response(
                {
                    "kind": "PartialObjectMetadataList",
                    "apiVersion": "meta.k8s.io/v1",
                    "metadata": {"resourceVersion": str(self.rv)},
                    "items": [_metadata_only(o) for o in items],
                }
            )
        return web.json_response(
            {
                "kind": f"{target.kind}List",
                "apiVersion": target.api_version,
                "metadata": {"resourceVersion": str(self.rv)},
                "items": items,
            }
        )

    async def _watch(
        self, request: web.Request, target: Target, query: dict[str, str], metadata_only: bool
    ) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        watcher = Watcher(target.group, target.plural, target.namespace, query, metadata_only)

        async def send(kind: str, obj: Obj) -> None:
            shown = _metadata_only(obj) if metadata_only else obj
            await response.write(json.dumps({"type": kind, "object": shown}).encode() + b"\n")

        if query.get("sendInitialEvents") == "true":
            for (group, plural, _, _), obj in list(self.store.items()):
                if (group, plural) == (target.group, target.plural) and watcher.wants(obj):
                    await send("ADDED", obj)
            bookmark = {
                "kind": "PartialObjectMetadata" if metadata_only else target.kind,
                "apiVersion": "meta.k8s.io/v1" if metadata_only else target.api_version,
                "metadata": {"resourceVersion": str(self.rv), "annotations": {INITIAL_EVENTS_END: "true"}},
            }
            await response.write(json.dumps({"type": "BOOKMARK", "object": bookmark}).encode() + b"\n")
        self.watchers.add(watcher)
        timeout = float(query.get("timeoutSeconds") or 1800)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        try:
            while (left := deadline - loop.time()) > 0:
                try:
                    event = await asyncio.wait_for(watcher.queue.get(), left)
                except TimeoutError:
                    break
                await send(event["type"], event["object"])
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        finally:
            self.watchers.discard(watcher)
        return response

    def _emit(self, target: Target, kind: str, obj: Obj) -> None:
        for watcher in self.watchers:
            if (watcher.group, watcher.plural) == (target.group, target.plural) and watcher.wants(obj):
                watcher.queue.put_nowait({"type": kind, "object": obj})

    def _stamp(self, target: Target, obj: Obj) -> Obj:
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        obj.setdefault("apiVersion", target.api_version)
        obj.setdefault("kind", target.kind)
        return obj

    def _create(self, target: Target, body: Obj) -> web.Response:
        obj = copy.deepcopy(body)
        meta = obj.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        name = meta.get("name", "")
        if not name:
            return _status(422, "Invalid", "metadata.name: Required value")
        key = self._key(target, name)
        if key in self.store:
            return _status(409, "AlreadyExists", f'{target.plural} "{name}" already exists')
        if target.namespace:
            meta["namespace"] = target.namespace
        meta.update(uid=str(uuid.uuid4()), creationTimestamp=_now(), generation=1)
        self.store[key] = self._stamp(target, obj)
        self._emit(target, "ADDED", obj)
        return web.json_response(obj, status=201)

    async def _write(self, request: web.Request, target: Target) -> web.Response:
        key = self._key(target, target.name)
        old = self.store.get(key)
        content_type = request.headers.get("Content-Type", "")
        text = await request.text()
        if "apply-patch" in content_type:
            patch = yaml.safe_load(text)
            if old is None:
                patch.setdefault("metadata", {})["name"] = target.name
                return self._create(target, patch)
            body = _merge(old, patch)
        elif old is None:
            if request.method == "PUT" and not target.subresource:
                return self._create(target, json.loads(text))
            return _status(404, "NotFound", f'{target.plural} "{target.name}" not found')
        elif request.method == "PUT":
            body = json.loads(text)
            wanted = body.get("metadata", {}).get("resourceVersion")
            if wanted and wanted != old["metadata"]["resourceVersion"]:
                return _status(409, "Conflict", "the object has been modified")
            if target.subresource:
                body = {**old, target.subresource: body.get(target.subresource)}
        elif "json-patch" in content_type:
            body = jsonpatch.apply_patch(old, json.loads(text))
        else:
            body = _merge(old, json.loads(text))
        obj = copy.deepcopy(body)
        meta = obj.setdefault("metadata", {})
        for kept in ("uid", "creationTimestamp", "name", "namespace"):
            if kept in old["metadata"]:
                meta[kept] = old["metadata"][kept]
        self.store[key] = self._stamp(target, obj)
        self._emit(target, "MODIFIED", obj)
        return web.json_response(obj)


class KubeStub:
    """The empty API server in a child process, and a kubeconfig for it."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.kubeconfig = workdir / "kubeconfig"
        self.log = workdir / "kube-stub.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> KubeStub:
        self.workdir.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "bench.kube_stub", str(self.port)],
                cwd=ROOT,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        try:
            self._wait()
        except BaseException:
            self.__exit__()
            raise
        self.kubeconfig.write_text(
            "apiVersion: v1\nkind: Config\ncurrent-context: bench\n"
            f"clusters: [{{name: bench, cluster: {{server: 'http://127.0.0.1:{self.port}'}}}}]\n"
            "contexts: [{name: bench, context: {cluster: bench, user: bench}}]\n"
            "users: [{name: bench, user: {}}]\n"
        )
        return self

    def _wait(self) -> None:
        assert self.proc is not None
        started = time.time()
        while time.time() - started < 30:
            if self.proc.poll() is not None:
                raise RuntimeError(f"bench.kube_stub exited: {self.log.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/version", timeout=2):
                    return
            except OSError:
                time.sleep(0.1)
        raise TimeoutError("bench.kube_stub did not answer")

    def cpu_seconds(self) -> float:
        assert self.proc is not None
        return process_cpu_seconds(self.proc.pid)

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def main(argv: list[str]) -> int:
    port = int(argv[0])
    web.run_app(EmptyCluster().app(), host="127.0.0.1", port=port, print=None, access_log=None)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
