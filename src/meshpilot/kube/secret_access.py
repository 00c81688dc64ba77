"""Whether a service account may read the Secrets of its namespace: istiod's SDS authorization.

istiod sends a Secret's private key only to a proxy whose service account may
``list`` ``secrets`` in its own namespace, asking the API server with a
SubjectAccessReview, and caches the answer (an allow for five minutes, a deny
for one). A review is a blocking HTTP call; generators must not wait for it,
so :meth:`KubeSecretAccess.check` answers from the cache, and on a miss starts
the review off the loop and answers ``None`` (not known yet: nothing private
is sent). When the review ends, ``on_change(namespace)`` asks for a push so
the proxies of that namespace get what they may now have. An expired answer
keeps answering until its review comes back.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

#: istiod's cacheTTL: a deny is asked again after a minute, an allow after five.
DENY_TTL = 60.0
ALLOW_TTL = 300.0


class NamespaceAccess:
    """Without an API server there is no RBAC to ask: a verified identity of the Secret's own
    namespace may read it (the namespace check is the SDS generator's). Used for Secrets from the
    config directory only, whose author chose the namespace."""

    def check(self, service_account: str, namespace: str) -> str | None:
        return ""


@dataclass(slots=True)
class _Answer:
    reason: str
    expires: float


Review = Callable[[str, str], str]


def subject_access_review(api: Any) -> Review:
    """A blocking review: "" if ``system:serviceaccount:<ns>:<sa>`` may list secrets in ``ns``."""
    from kubernetes.client import (
        AuthorizationV1Api,
        V1ResourceAttributes,
        V1SubjectAccessReview,
        V1SubjectAccessReviewSpec,
    )

    authz = AuthorizationV1Api(api)

    def review(service_account: str, namespace: str) -> str:
        user = f"system:serviceaccount:{namespace}:{service_account}"
        body = V1SubjectAccessReview(
            spec=V1SubjectAccessReviewSpec(
                user=user,
                resource_attributes=V1ResourceAttributes(
                    namespace=namespace, verb="list", resource="secrets"
                ),
            )
        )
        status = authz.create_subject_access_review(body, _request_timeout=(5, 10)).status
        if status is None or not status.allowed:
            reason = (status.reason if status is not None else "") or "no reason given"
            return f"{service_account}/{namespace} is not authorized to read secrets: {reason}"
        return ""

    return review


class KubeSecretAccess:
    """SubjectAccessReviews, cached as istiod caches them, never waited for on the loop."""

    def __init__(
        self,
        review: Review,
        on_change: Callable[[str], None],
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._review = review
        self._on_change = on_change
        self._clock = clock
        self._answers: dict[tuple[str, str], _Answer] = {}
        self._pending: dict[tuple[str, str], asyncio.Task[None]] = {}

    def check(self, service_account: str, namespace: str) -> str | None:
        key = (service_account, namespace)
        answer = self._answers.get(key)
        if answer is None or answer.expires <= self._clock():
            self._start(key)
        return answer.reason if answer is not None else None

    def _start(self, key: tuple[str, str]) -> None:
        if key in self._pending:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop (a test calling generators directly): stays unknown
        self._pending[key] = loop.create_task(self._run(key))

    async def _run(self, key: tuple[str, str]) -> None:
        try:
            try:
                reason = await asyncio.to_thread(self._review, *key)
            except Exception as err:  # an API error is a deny, as istiod caches it
                reason = f"{key[0]}/{key[1]}: SubjectAccessReview failed: {err}"
                log.warning("%s", reason)
            old = self._answers.get(key)
            ttl = ALLOW_TTL if not reason else DENY_TTL
            self._answers[key] = _Answer(reason, self._clock() + ttl)
            if old is None or (old.reason == "") != (reason == ""):
                self._on_change(key[1])
        finally:
            self._pending.pop(key, None)

    async def shutdown(self) -> None:
        for task in list(self._pending.values()):
            task.cancel()
        self._pending.clear()
