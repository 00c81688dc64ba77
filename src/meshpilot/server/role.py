"""The roles of the processes of ``meshpilot discovery`` (``docs/architecture.md``, "Push workers")."""

from __future__ import annotations

import enum


class Role(enum.Enum):
    """What a process of ``meshpilot discovery`` does."""

    #: Everything, in one process (``--push-workers 1``).
    SINGLE = "single"
    #: The sources, the registries' debounce, the CA's loading, webhooks, HTTP and monitoring; the
    #: push workers serve xDS (``pool``).
    MAIN = "main"
    #: xDS and CreateCertificate on the shared ports, from a replica the main process keeps current.
    WORKER = "worker"
