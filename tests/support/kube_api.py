"""A Kubernetes API server on loopback for tests: ``KubeApiServer`` runs ``KubeApiEmulator``.

The server runs on its own event loop in a background thread, so sync tests and other
processes (through ``write_kubeconfig``) talk to it over real HTTP::

    with KubeApiServer() as kube:
        kube.apply(pod("a", "default", "10.0.0.1", {"app": "a"}))
        with kube.api_client() as api:
            CoreV1Api(api).list_namespaced_pod("default")

Test code writes through ``apply``/``delete``, which produce the same watch events as API
writes. ``restart()`` keeps the objects and the resourceVersion counter and the port.
"""

from __future__ import annotations

import asyncio
import copy
import socket
import threading
from collections.abc import Coroutine, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Self, TypeVar

import aiohttp.web
import yaml
from kubernetes import client as k8s_client
from support.kube_emulator import KubeApiEmulator
from support.kube_resources import RESOURCES, Obj, ResourceType, StatusError, find_resource, resource_of

__all__ = ["RESOURCES", "KubeApiEmulator", "KubeApiServer", "ResourceType", "StatusError"]

T = TypeVar("T")


class KubeApiServer:
    """``KubeApiEmulator`` served on ``host:port`` (port 0 picks one, kept across restarts).

    ``stop()`` then ``start()`` also keeps the objects, the counter and the port.
    """

    def __init__(self, port: int = 0, *, host: str = "127.0.0.1", history_limit: int = 1000) -> None:
        self.host, self.port = host, port
        self.emulator = KubeApiEmulator(history_limit=history_limit)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._web: aiohttp.web.Server | None = None
        self._listener: asyncio.Server | None = None
        #: Every connection the listener accepted (aiohttp's handlers), closed when it stops.
        self._protocols: list[Any] = []

    # -- Lifecycle --

    def start(self) -> Self:
        """Start the loop thread (if not running) and listen."""
        if self._loop is None:
            # kmock binds asyncio primitives to the loop it first runs on: a new loop, a new emulator.
            emulator = KubeApiEmulator(history_limit=self.emulator.history_limit)
            emulator.carry_over(self.emulator)
            self.emulator = emulator
            self._loop = asyncio.new_event_loop()
            self._thread = threading.Thread(target=self._loop.run_forever, name="kube-api", daemon=True)
            self._thread.start()
            self._call(self.emulator.__aenter__())
        self._call(self._listen())
        return self

    def stop(self) -> None:
        """Stop listening, end every watch stream and connection, stop the loop thread. Idempotent."""
        if self._loop is None:
            return
        self._call(self._unlisten())
        self._call(self.emulator.__aexit__(None, None, None))
        self._loop.call_soon_threadsafe(self._loop.stop)
        assert self._thread is not None
        self._thread.join(timeout=5)
        self._loop.close()
        self._loop = self._thread = None

    def restart(self) -> None:
        """Go away (clients see their connections and watches end) and come back on the same port."""
        self._call(self._unlisten())
        self._call(self._listen())

    def stop_listening(self) -> None:
        """Go away (connections refused, watches end) while tests can still change the objects."""
        self._call(self._unlisten())

    def start_listening(self) -> None:
        """Come back on the same port after ``stop_listening``."""
        self._call(self._listen())

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def _listen(self) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        self.port = sock.getsockname()[1]
        web = self._web = aiohttp.web.Server(self.emulator)
        made = self._protocols = []

        def protocol() -> Any:
            handler = web()
            made.append(handler)
            return handler

        self._listener = await asyncio.get_running_loop().create_server(protocol, sock=sock)

    async def _unlisten(self) -> None:
        # Order: stop accepting, end the watches (their handlers return), close the connections.
        if self._listener is None or self._web is None:
            return
        self._listener.close()
        # A connection accepted just before the close is set up a few loop turns later, and
        # shutdown() forgets any that join while it runs: its socket would outlive the server
        # and fail a later test with a ResourceWarning. Let those arrive first.
        await asyncio.sleep(0.05)
        self.emulator.end_watches()
        await self._web.shutdown(timeout=0.25)  # handlers in flight; watches have ended
        await self._listener.wait_closed()
        await self._close_connections()
        self._listener = self._web = None

    async def _close_connections(self) -> None:
        """Close every connection the listener accepted that shutdown() did not: one set up while it
        ran, or accepted just before the close and made a few loop turns later, would otherwise be left
        for the collector to find in a later test. A handler gets its transport when its connection is
        made, and loses it when it is lost: those never seen with one are waited for, boundedly."""
        seen: set[int] = set()
        for _ in range(20):
            waiting = False
            for handler in self._protocols:
                transport = handler.transport
                if transport is None:
                    waiting = waiting or id(handler) not in seen
                    continue
                seen.add(id(handler))
                if not transport.is_closing():
                    transport.close()
            await asyncio.sleep(0.01)  # closed transports close their sockets on the next turns
            if not waiting:
                break
        # close() keeps a socket open until its write buffer drains, which it never does when the
        # client stopped reading (a watch's events to a process being stopped), and aiohttp forgets a
        # transport it closed: the loop would stop with the socket open, and the collector would find
        # it in a later test. So every transport of this loop still connected is aborted: only this
        # server's connections live on it, and asyncio's own map of a selector loop's transports (by
        # file descriptor, private) holds each from its creation, before aiohttp hears of it. A lost
        # one has no protocol; abort() could fail on it.
        # A connection accepted just before the listener closed gets its transport from a task of the
        # loop's (asyncio's ``_accept_connection2``), which a busy host may run after the waits above
        # (a socket outlived the server at d550b03 so): such tasks are waited for, boundedly, so that
        # their transports are in the map swept below.
        current = asyncio.current_task()
        accepting = [
            task
            for task in asyncio.all_tasks()
            if task is not current and getattr(task.get_coro(), "__name__", "") == "_accept_connection2"
        ]
        if accepting:
            await asyncio.wait(accepting, timeout=2)
        registry: Mapping[int, asyncio.Transport] = asyncio.get_running_loop()._transports  # type: ignore[attr-defined]
        connected = [t for t in list(registry.values()) if t.get_protocol() is not None]
        for transport in connected:
            transport.abort()
        if connected:
            await asyncio.sleep(0.01)
        self._protocols = []

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        assert self._loop is not None, "the server is not started"
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=10)

    def _run(self, fn: Any, *args: Any) -> Any:
        """Run ``fn(*args)`` on the loop's thread, where the emulator's state lives; returns a copy."""

        async def call() -> Any:
            return copy.deepcopy(fn(*args))

        return self._call(call())

    # -- Clients --

    def write_kubeconfig(self, path: Path, name: str = "kube-api", namespace: str = "") -> Path:
        """A kubeconfig for this server (plain HTTP, a dummy token) with ``name`` as current context."""
        context: dict[str, str] = {"cluster": name, "user": name}
        if namespace:
            context["namespace"] = namespace
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": name, "cluster": {"server": self.url}}],
            "users": [{"name": name, "user": {"token": "test-token"}}],
            "contexts": [{"name": name, "context": context}],
            "current-context": name,
        }
        path.write_text(yaml.safe_dump(config))
        return path

    def api_client(self) -> k8s_client.ApiClient:
        """An official client for this server; close it (``with server.api_client() as api:``)."""
        configuration = k8s_client.Configuration(host=self.url)
        return k8s_client.ApiClient(configuration)

    # -- Direct access from test code; writes produce watch events like API writes. --

    def apply(self, obj: Mapping[str, Any]) -> Obj:
        """Create the object, or replace it whatever its resourceVersion. Returns the stored object."""
        rtype = resource_of(obj)
        body = dict(obj)
        body["metadata"] = {k: v for k, v in obj.get("metadata", {}).items() if k != "resourceVersion"}
        namespace, name = body["metadata"].get("namespace", ""), body["metadata"]["name"]

        def write() -> Obj:
            try:
                return self.emulator.replace_object(rtype, namespace, name, body)
            except StatusError as e:
                if e.code != 404:
                    raise
                return self.emulator.create_object(rtype, namespace, body)

        result: Obj = self._run(write)
        return result

    def delete(self, resource: str, namespace: str, name: str) -> Obj:
        """Delete by resource (kind, plural or plural.group); raises StatusError 404 if missing."""
        result: Obj = self._run(self.emulator.delete_object, find_resource(resource), namespace, name)
        return result

    def get(self, resource: str, namespace: str, name: str) -> Obj | None:
        try:
            result: Obj = self._run(self.emulator.get_object, find_resource(resource), namespace, name)
        except StatusError:
            return None
        return result

    def objects(self, resource: str, namespace: str | None = None) -> list[Obj]:
        """The stored objects of a resource, in one namespace or all."""
        objs: list[Obj] = self._run(self.emulator.list_objects, find_resource(resource))
        return [o for o in objs if namespace is None or o["metadata"].get("namespace") == namespace]

    @property
    def resource_version(self) -> int:
        return self.emulator.resource_version

    def compact(self) -> None:
        """Drop the watch history: watches resuming from an older resourceVersion get 410."""
        self._run(self.emulator.compact)

    def bookmark(self) -> None:
        """Send a BOOKMARK to every watch that allowed bookmarks."""
        self._run(self.emulator.bookmark)

    def fail_next(self, count: int = 1, status: int = 500) -> None:
        """Answer the next ``count`` object requests (list, watch, get, writes) with ``status``."""
        self._run(self.emulator.fail_next, count, status)

    def request_count(self, method: str | None = None, path: str | None = None) -> int:
        """How many requests were served, optionally only those with this method and URL path."""
        requests = list(self.emulator)  # kmock iterates over the requests it served
        return sum(
            1
            for r in requests
            if (method is None or r.method.value.upper() == method.upper())
            and (path is None or r.url.path == path)
        )
