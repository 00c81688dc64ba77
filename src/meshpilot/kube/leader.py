"""Leader election on a coordination.k8s.io Lease, as client-go's LeaderElector does it.

Singleton writers run only on the replica holding the Lease. The rules:

* a replica takes the Lease when it does not exist, has no holder, or its
  holder has not renewed it for ``lease_duration`` as measured on this
  replica's own clock since the record last changed (clocks of replicas are
  never compared);
* writes are replaces carrying the resourceVersion read, so of two replicas
  racing for the Lease exactly one wins (the other gets 409 Conflict);
* the leader renews every ``retry_period``; if it cannot renew within
  ``renew_deadline`` it stops leading, before anyone else may take over;
* stopping cleanly releases the Lease (no holder, one second duration) so
  another replica takes over at its next try instead of after the duration.

istiod's durations: 30 s lease, renew deadline 15 s, retry 7.5 s. Its elections
meshpilot holds: ``istio-status-leader`` (status writes; a Lease in istiod too)
and ``istio-namespace-controller-election`` (the root-cert ConfigMaps; istiod
keeps that one on a ConfigMap lock, meshpilot on a Lease of the same name).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import os
import socket
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from kubernetes import client as kclient

from meshpilot.kube.client import KubeError, request_json, resource_path

log = logging.getLogger(__name__)

STATUS_LEASE = "istio-status-leader"
NAMESPACE_CONTROLLER_LEASE = "istio-namespace-controller-election"


def default_identity() -> str:
    """The pod name, as istiod uses it; outside a pod, a name from the host."""
    return os.environ.get("POD_NAME") or f"unknown-{socket.gethostname()}-{os.getpid()}"


@dataclass(frozen=True, slots=True)
class LeaseTimings:
    lease_duration: float = 30.0
    renew_deadline: float = 15.0
    retry_period: float = 7.5

    @classmethod
    def for_duration(cls, seconds: float) -> LeaseTimings:
        """istiod's proportions for a given lease duration."""
        return cls(seconds, seconds / 2, seconds / 4)


def _now_micro() -> str:
    now = datetime.datetime.now(datetime.UTC)
    return now.strftime("%Y-%m-%dT%H:%M:%S.%f") + "Z"


class LeaderElector:
    """Runs ``lead`` (a coroutine factory) while this replica holds the Lease ``name``."""

    def __init__(
        self,
        api: kclient.ApiClient,
        namespace: str,
        name: str,
        lead: Callable[[], Coroutine[Any, Any, None]],
        *,
        identity: str | None = None,
        timings: LeaseTimings = LeaseTimings(),
    ) -> None:
        self._api = api
        self.namespace = namespace
        self.name = name
        self.identity = identity or default_identity()
        self.timings = timings
        self._lead = lead
        self.leading = False
        #: The record as last read, and when (on our monotonic clock) it last changed.
        self._observed: tuple[str, str] | None = None
        self._observed_at = 0.0
        self._path = resource_path("coordination.k8s.io", "v1", "leases", namespace)

    async def run(self, stop: asyncio.Event) -> None:
        """Try, lead, lose, try again, until ``stop``; then release the Lease if held."""
        try:
            while not stop.is_set():
                if await self._try():
                    await self._leading(stop)
                else:
                    await _sleep_or_stop(stop, self.timings.retry_period)
        finally:
            if self.leading:
                self._set_leading(False)
            await self._release()

    async def _leading(self, stop: asyncio.Event) -> None:
        self._set_leading(True)
        task: asyncio.Task[None] = asyncio.create_task(self._lead(), name=f"leader {self.name}")
        last_renew = time.monotonic()
        try:
            while not stop.is_set() and not task.done():
                await _sleep_or_stop(stop, self.timings.retry_period)
                if stop.is_set():
                    break
                if await self._try():
                    last_renew = time.monotonic()
                elif time.monotonic() - last_renew >= self.timings.renew_deadline or not self._held_by_us():
                    log.warning("lease %s/%s: lost (could not renew)", self.namespace, self.name)
                    break
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            if task.done() and not task.cancelled() and task.exception() is not None:
                log.error("lease %s/%s: leader task failed: %s", self.namespace, self.name, task.exception())
            self._set_leading(False)

    def _set_leading(self, leading: bool) -> None:
        if leading != self.leading:
            self.leading = leading
            log.info(
                "lease %s/%s: %s %s",
                self.namespace,
                self.name,
                self.identity,
                "is leading" if leading else "stopped leading",
            )

    def _held_by_us(self) -> bool:
        return self._observed is not None and self._observed[0] == self.identity

    async def _try(self) -> bool:
        try:
            return await asyncio.to_thread(self._try_acquire_or_renew)
        except KubeError as err:
            log.debug("lease %s/%s: %s", self.namespace, self.name, err)
            return False

    def _try_acquire_or_renew(self) -> bool:
        now = _now_micro()
        duration = max(1, round(self.timings.lease_duration))
        try:
            lease = request_json(self._api, "GET", f"{self._path}/{self.name}", timeout=(5.0, 10.0))
        except KubeError as err:
            if err.status != 404:
                raise
            body = self._lease_body({}, now, now, duration, 0)
            try:
                request_json(self._api, "POST", self._path, body=body, timeout=(5.0, 10.0))
            except KubeError as create_err:
                if create_err.status == 409:  # another replica created it first
                    return False
                raise
            self._observe(self.identity, now)
            return True
        spec = lease.get("spec") or {}
        holder = str(spec.get("holderIdentity") or "")
        renew = str(spec.get("renewTime") or "")
        self._observe(holder, renew)
        held_duration = float(spec.get("leaseDurationSeconds") or self.timings.lease_duration)
        if holder and holder != self.identity and time.monotonic() - self._observed_at < held_duration:
            return False
        transitions = int(spec.get("leaseTransitions") or 0)
        acquire = str(spec.get("acquireTime") or now)
        if holder != self.identity:
            transitions += 1
            acquire = now
        body = self._lease_body(lease.get("metadata") or {}, acquire, now, duration, transitions)
        try:
            request_json(self._api, "PUT", f"{self._path}/{self.name}", body=body, timeout=(5.0, 10.0))
        except KubeError as err:
            if err.status == 409:  # someone wrote it since we read it
                return False
            raise
        self._observe(self.identity, now)
        return True

    def _observe(self, holder: str, renew: str) -> None:
        if self._observed != (holder, renew):
            self._observed = (holder, renew)
            self._observed_at = time.monotonic()

    def _lease_body(
        self, meta: dict[str, Any], acquire: str, renew: str, duration: int, transitions: int
    ) -> dict[str, Any]:
        metadata: dict[str, Any] = {"name": self.name, "namespace": self.namespace}
        if meta.get("resourceVersion"):
            metadata["resourceVersion"] = meta["resourceVersion"]
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": metadata,
            "spec": {
                "holderIdentity": self.identity,
                "leaseDurationSeconds": duration,
                "acquireTime": acquire,
                "renewTime": renew,
                "leaseTransitions": transitions,
            },
        }

    async def _release(self) -> None:
        if not self._held_by_us():
            return
        try:
            await asyncio.to_thread(self._release_sync)
        except KubeError as err:
            log.info("lease %s/%s: not released: %s", self.namespace, self.name, err)

    def _release_sync(self) -> None:
        lease = request_json(self._api, "GET", f"{self._path}/{self.name}", timeout=(2.0, 5.0))
        spec = lease.get("spec") or {}
        if spec.get("holderIdentity") != self.identity:
            return
        now = _now_micro()
        body = self._lease_body(
            lease.get("metadata") or {}, now, now, 1, int(spec.get("leaseTransitions") or 0)
        )
        body["spec"]["holderIdentity"] = ""
        request_json(self._api, "PUT", f"{self._path}/{self.name}", body=body, timeout=(2.0, 5.0))
        self._observed = None
        log.info("lease %s/%s: released", self.namespace, self.name)


async def _sleep_or_stop(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)
