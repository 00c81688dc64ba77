"""What the processes of a pool share in memory rather than through the change log: numbers every
worker reads at once, for which a message would come too late."""

from __future__ import annotations

from dataclasses import dataclass
from multiprocessing.context import SpawnContext
from multiprocessing.sharedctypes import Synchronized, SynchronizedArray

from meshpilot.xds.rate_limit import SharedState


@dataclass(frozen=True, slots=True)
class PoolShared:
    #: The number of the last push the main process sent (a worker admits a new stream once it
    #: applied that one: ``Replica.caught_up``).
    pushes_sent: Synchronized[int]
    #: The new-stream token bucket of the server as a whole (``PILOT_MAX_REQUESTS_PER_SECOND``):
    #: a fixed share per worker would let the busiest worker set the pace, since the kernel does not
    #: spread connections exactly evenly, and would slow the reconnects after a worker died.
    stream_bucket: SynchronizedArray[float]
    #: Each worker's loop heartbeat (``time.monotonic()``, one clock for the machine), by index: a
    #: worker whose loop stopped moving is killed and started again (``PushWorkerPool.watch``).
    heartbeats: SynchronizedArray[float]

    @classmethod
    def create(cls, context: SpawnContext, workers: int) -> PoolShared:
        return cls(
            context.Value("Q", 0, lock=False),
            SharedState.create(context).array,
            context.Array("d", workers, lock=False),
        )
