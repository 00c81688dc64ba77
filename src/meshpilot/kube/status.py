"""Status writes on Istio config: ``status.observedGeneration``, by the leader only.

With ``PILOT_ENABLE_STATUS`` istiod reports on each Istio object which
generation it has processed. meshpilot writes that field through the
``/status`` subresource. Only the holder of the ``istio-status-leader`` Lease
writes, so replicas do not fight over the same objects; a new leader writes
every object once, as nothing tells it what its predecessor finished.
"""

from __future__ import annotations

import asyncio
import logging

from kubernetes import client as kclient

from meshpilot.config.schemas import SCHEMAS
from meshpilot.kube.client import KubeError, request_json, resource_path
from meshpilot.model.config import Config

log = logging.getLogger(__name__)

StatusKey = tuple[str, str, str]  # kind, namespace, name
_RETRY = 2.0


class StatusWriter:
    def __init__(self, api: kclient.ApiClient) -> None:
        self._api = api
        self._latest: dict[StatusKey, Config] = {}
        self._written: dict[StatusKey, int] = {}
        self._wake = asyncio.Event()

    def observe(self, config: Config) -> None:
        """A config object as last seen (called for every Istio object applied)."""
        key = (config.kind.value, config.namespace, config.name)
        self._latest[key] = config
        if self._written.get(key) != config.meta.generation:
            self._wake.set()

    def forget(self, kind: str, namespace: str, name: str) -> None:
        self._latest.pop((kind, namespace, name), None)
        self._written.pop((kind, namespace, name), None)

    async def lead(self) -> None:
        """Write until cancelled (when leadership ends)."""
        self._written.clear()
        self._wake.set()
        while True:
            await self._wake.wait()
            self._wake.clear()
            due = [(key, c) for key, c in self._latest.items() if self._written.get(key) != c.meta.generation]
            failed = False
            for key, config in sorted(due, key=lambda item: item[0]):
                if await asyncio.to_thread(self._write, config):
                    self._written[key] = config.meta.generation
                else:
                    failed = True
            if failed:  # the API server refused or was away: try those again in a while
                await asyncio.sleep(_RETRY)
                self._wake.set()

    def _write(self, config: Config) -> bool:
        schema = SCHEMAS[config.kind]
        path = resource_path(schema.group, schema.versions[0], schema.plural, config.namespace, config.name)
        body = {"status": {"observedGeneration": config.meta.generation}}
        try:
            request_json(
                self._api, "PATCH", f"{path}/status", body=body, content_type="application/merge-patch+json"
            )
        except KubeError as err:
            if err.status != 404:  # deleted meanwhile: nothing to write
                log.warning(
                    "status of %s %s/%s not written: %s",
                    config.kind.value,
                    config.namespace,
                    config.name,
                    err,
                )
            return err.status == 404
        return True
