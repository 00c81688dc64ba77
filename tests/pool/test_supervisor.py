"""The supervisor's decisions that need no worker process: a hung worker is killed."""

from __future__ import annotations

import time
from typing import Any, cast

from prometheus_client import CollectorRegistry

from meshpilot.pool.change_log import ChangeLog
from meshpilot.pool.link import WorkerLink
from meshpilot.pool.supervisor import PushWorkerPool
from meshpilot.server.settings import DiscoverySettings


class _Process:
    def __init__(self) -> None:
        self.killed = False

    def kill(self) -> None:
        self.killed = True


class _Link:
    def __init__(self, ready: bool) -> None:
        self.ready = ready
        self.process = _Process()


def _pool() -> PushWorkerPool:
    return PushWorkerPool(DiscoverySettings(push_workers=2), ChangeLog(), CollectorRegistry())


def test_a_serving_worker_whose_loop_stopped_is_killed_and_one_that_beats_is_not() -> None:
    pool = _pool()
    now = time.monotonic()
    pool.shared.heartbeats[0] = now - 61.0  # past the liveness bound (60 s)
    pool.shared.heartbeats[1] = now - 1.0
    hung, beating = _Link(ready=True), _Link(ready=True)
    pool._kill_if_hung(0, cast(WorkerLink, hung))
    pool._kill_if_hung(1, cast(WorkerLink, beating))
    assert hung.process.killed and not beating.process.killed


def test_a_worker_still_starting_is_not_judged_by_its_heartbeat() -> None:
    pool = _pool()
    pool.shared.heartbeats[0] = 0.0  # never stamped: the slot of a worker that is importing
    starting: Any = _Link(ready=False)
    pool._kill_if_hung(0, cast(WorkerLink, starting))
    assert not starting.process.killed
