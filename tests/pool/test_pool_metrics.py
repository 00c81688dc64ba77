"""How a pool's /metrics adds its workers' samples to the main process's (``pool.metrics``), with
real registries of the server's metrics read back by prometheus-client's own parser."""

from __future__ import annotations

from typing import Any, cast

from prometheus_client.parser import text_string_to_metric_families

from meshpilot.pool.metrics import WORKER_LABEL, PoolMetrics, families, scrape
from meshpilot.pool.supervisor import PushWorkerPool
from meshpilot.server.metrics import Metrics

Scraped = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def _scrape(main: Metrics, workers: list[Metrics]) -> tuple[str, Scraped]:
    """The text, and its samples as prometheus-client reads them (counters with ``_total``)."""
    text = scrape(families(main.registry), {i: families(w.registry) for i, w in enumerate(workers)}).decode()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    return text, samples


def test_streams_and_pushes_add_up_the_model_counts_once_and_processes_stay_apart() -> None:
    main, workers = Metrics(), [Metrics(), Metrics()]
    for metrics, streams in zip(workers, (3, 4), strict=True):
        metrics.xds_clients.labels(version="1.28.0").set(streams)
        metrics.for_type("cds").pushes.inc(streams)
        metrics.convergence_time.observe(0.05)
        metrics.convergence_time.observe(2.0)
    workers[1].xds_clients.labels(version="1.27.0").set(1)
    for metrics in (main, *workers):
        # Every process holds the same model, and starts every push.
        metrics.services.set(12)
        metrics.push_triggers.labels(type="config").inc(5)

    text, scraped = _scrape(main, workers)

    assert scraped[("pilot_xds", (("version", "1.28.0"),))] == 7
    assert scraped[("pilot_xds", (("version", "1.27.0"),))] == 1
    # Counters keep istiod's names (no _total) after the merge.
    assert 'pilot_xds_pushes{type="cds"} 7.0' in text.splitlines()
    assert scraped[("pilot_xds_pushes_total", (("type", "cds"),))] == 7
    assert scraped[("pilot_proxy_convergence_time_count", ())] == 4
    assert scraped[("pilot_proxy_convergence_time_bucket", (("le", "0.1"),))] == 2
    assert scraped[("pilot_proxy_convergence_time_bucket", (("le", "+Inf"),))] == 4
    assert scraped[("pilot_services", ())] == 12
    assert scraped[("pilot_push_triggers_total", (("type", "config"),))] == 5
    assert scraped[("istio_build", (("component", "pilot"), ("tag", _tag(scraped))))] == 1
    # The main process's own figures unlabelled, each worker's under its index.
    starts = {labels: v for (name, labels), v in scraped.items() if name == "process_start_time_seconds"}
    assert set(starts) == {(), ((WORKER_LABEL, "0"),), ((WORKER_LABEL, "1"),)}


def _tag(scraped: Scraped) -> str:
    [tag] = [dict(labels)["tag"] for name, labels in scraped if name == "istio_build"]
    return tag


class _Link:
    def __init__(self, pid: int) -> None:
        self.pid = pid


class _Pool:
    """What ``PoolMetrics`` reads of a pool: its links' pids and the workers' answers."""

    def __init__(self, workers: dict[int, tuple[int, Metrics]]) -> None:
        self.workers = workers
        self.missing: set[int] = set()

    @property
    def links(self) -> list[_Link | None]:
        return [_Link(self.workers[i][0]) if i in self.workers else None for i in range(2)]

    async def answers(self, name: str) -> dict[int, Any]:
        assert name == "metrics"
        return {i: families(m.registry) for i, (_, m) in self.workers.items() if i not in self.missing}


def _read(text: bytes) -> Scraped:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text.decode())
        for s in family.samples
    }


async def test_counters_never_go_down_when_a_worker_misses_a_scrape_or_is_replaced() -> None:
    main, first, second = Metrics(), Metrics(), Metrics()
    for metrics, count in ((first, 10), (second, 5)):
        metrics.for_type("cds").pushes.inc(count)
        metrics.xds_clients.labels(version="1.28.0").set(count)
    pool = _Pool({0: (100, first), 1: (200, second)})
    pool_metrics = PoolMetrics(main.registry, cast(PushWorkerPool, pool))
    pushes = ("pilot_xds_pushes_total", (("type", "cds"),))
    streams = ("pilot_xds", (("version", "1.28.0"),))

    assert _read(await pool_metrics.exposition())[pushes] == 15
    # Worker 1 busy: its last answer stands in.
    pool.missing = {1}
    assert _read(await pool_metrics.exposition())[pushes] == 15
    # Worker 0 replaced (a new pid, counting from 0): what the old one counted stays counted; its
    # streams went with it.
    replacement = Metrics()
    replacement.for_type("cds").pushes.inc(2)
    pool.missing = set()
    pool.workers[0] = (101, replacement)
    scraped = _read(await pool_metrics.exposition())
    assert scraped[pushes] == 10 + 5 + 2
    assert scraped[streams] == 5
    # And again: the retired counts are added once, not once per scrape.
    assert _read(await pool_metrics.exposition())[pushes] == 17
