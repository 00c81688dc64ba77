"""``/metrics`` of a push-worker pool: the main process's metrics and its workers', as one server's.

Each worker sends the samples of its registry (``worker_handlers``); the main process adds them to
its own, sample by sample (same name, same labels), which is right for what each process counts or
holds of its own: streams (``pilot_xds``), pushes, generation times, cache entries, CSRs signed.
``pilot_pushcontext_init_seconds`` is added too: every worker builds its own snapshot for each push
(the main process one more), and each build is time spent, so a push counts once per process.
Two kinds of metric are not added:

- ``REPLICATED``: every process holds the same model, so it sets the same value (the number of
  services) or counts the same event (each debounced push starts in every process). The main
  process's is the server's; adding would multiply it by the number of processes.
- ``PER_PROCESS``: the OS process itself (CPU seconds, resident memory, open and maximum file
  descriptors, start time). Some of these add up and some do not (start time, the fd limit), so none
  is added: each worker's series carries ``push_worker="<index>"`` next to the main process's
  unlabelled one. istiod's dashboards read them per series; ``sum()`` gives the server's CPU and
  memory, ``max()`` the busiest worker.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Metric
from prometheus_client.registry import Collector

from meshpilot.pool.calls import Handlers
from meshpilot.pool.supervisor import PushWorkerPool
from meshpilot.server.metrics import exposition

if TYPE_CHECKING:
    from meshpilot.server.app import DiscoveryApp

#: The label telling the workers' per-process series apart (the main process's have none).
WORKER_LABEL = "push_worker"

REPLICATED = frozenset(
    {
        "istio_build",
        "pilot_services",
        "pilot_virt_services",
        "pilot_push_triggers",
        "meshpilot_unapplied_config",
        "meshpilot_unimplemented_settings",
    }
)
PER_PROCESS = ("process_", "python_")

Labels = tuple[tuple[str, str], ...]
#: A sample as it crosses the pipe: its name, labels and value.
Sample = tuple[str, Labels, float]
#: A metric family as it crosses the pipe: name, type, help, unit and samples.
Family = tuple[str, str, str, str, list[Sample]]


def families(registry: CollectorRegistry) -> list[Family]:
    """What ``registry`` exposes now, as plain data."""
    return [
        (
            metric.name,
            metric.type,
            metric.documentation,
            metric.unit,
            [(s.name, tuple(sorted(s.labels.items())), s.value) for s in metric.samples],
        )
        for metric in registry.collect()
    ]


def worker_handlers(app: DiscoveryApp) -> Handlers:
    async def metrics() -> list[Family]:
        return families(app.metrics.registry)

    return {"metrics": metrics}


def merge(main: list[Family], workers: Mapping[int, list[Family]]) -> list[Metric]:
    """The pool's families: the main process's, with the workers' added as the module says."""
    merged: dict[str, Metric] = {}
    values: dict[str, dict[tuple[str, Labels], float]] = {}

    def add(family: Family, worker: int | None) -> None:
        name, kind, documentation, unit, samples = family
        if worker is not None and name in REPLICATED:
            return
        if name not in merged:
            merged[name] = Metric(name, documentation, kind, unit)
            values[name] = {}
        into = values[name]
        for sample, labels, value in samples:
            if worker is not None and name.startswith(PER_PROCESS):
                labels = (*labels, (WORKER_LABEL, str(worker)))
            key = (sample, labels)
            into[key] = into.get(key, 0.0) + value

    for family in main:
        add(family, None)
    for worker, answer in sorted(workers.items()):
        for family in answer:
            add(family, worker)
    for name, metric in merged.items():
        for (sample, labels), value in values[name].items():
            metric.add_sample(sample, dict(labels), value)
    return list(merged.values())


class _Fixed(Collector):
    def __init__(self, metrics: list[Metric]) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        return iter(self._metrics)


def scrape(main: list[Family], workers: Mapping[int, list[Family]]) -> bytes:
    """The text of the pool's families (``server.metrics.exposition``'s format)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Fixed(merge(main, workers)))
    return exposition(registry)


#: Kinds whose samples only grow: what a worker that is gone counted stays counted.
MONOTONIC = frozenset({"counter", "histogram", "summary"})
#: The worker index the counts of workers that are gone are added under.
RETIRED = -1


class PoolMetrics:
    """The pool's ``/metrics``, scrape after scrape. A counter must not go down: Prometheus reads a
    drop as a reset (and ``rate()`` jumps). So a worker that misses a scrape (busy, or starting) is
    counted with its last answer, and when a worker is replaced its last counts are kept, added to
    the pool's from then on; its gauges (its streams) go with it."""

    def __init__(self, registry: CollectorRegistry, pool: PushWorkerPool) -> None:
        self._registry = registry
        self._pool = pool
        #: Each worker's last answer, with the pid that gave it.
        self._last: dict[int, tuple[int | None, list[Family]]] = {}
        #: (name, sample, labels) -> value, and each name's family fields, of workers that are gone.
        self._retired: dict[tuple[str, str, Labels], float] = {}
        self._retired_kinds: dict[str, tuple[str, str, str]] = {}

    async def exposition(self) -> bytes:
        answers = await self._pool.answers("metrics")
        pids = {index: link.pid for index, link in enumerate(self._pool.links) if link is not None}
        for index, (pid, answer) in list(self._last.items()):
            if pids.get(index) != pid:
                self._retire(answer)
                del self._last[index]
        for index, answer in answers.items():
            self._last[index] = (pids.get(index), answer)
        workers = {index: answer for index, (_, answer) in self._last.items()}
        if self._retired:
            workers[RETIRED] = self._retired_families()
        return scrape(families(self._registry), workers)

    def _retire(self, answer: list[Family]) -> None:
        for name, kind, documentation, unit, samples in answer:
            if kind not in MONOTONIC or name in REPLICATED or name.startswith(PER_PROCESS):
                continue
            self._retired_kinds[name] = (kind, documentation, unit)
            for sample, labels, value in samples:
                if sample.endswith("_created"):  # a time, not a count
                    continue
                key = (name, sample, labels)
                self._retired[key] = self._retired.get(key, 0.0) + value

    def _retired_families(self) -> list[Family]:
        by_name: dict[str, list[Sample]] = {}
        for (name, sample, labels), value in self._retired.items():
            by_name.setdefault(name, []).append((sample, labels, value))
        out: list[Family] = []
        for name, samples in by_name.items():
            kind, documentation, unit = self._retired_kinds[name]
            out.append((name, kind, documentation, unit, samples))
        return out
