"""What every benchmark run shares: percentiles, the run log, and the simulated fleet's proxies."""

from __future__ import annotations

import time

from bench.scenario import Scenario
from bench.sidecar import ProxySpec

#: Every server in the bench, meshpilot or istiod, debounces changes this long (the endpoint goal's
#: p99 is counted after it); ``DEBOUNCE`` is the flag's form of it.
DEBOUNCE_SECONDS = 0.1
DEBOUNCE = f"{round(DEBOUNCE_SECONDS * 1000)}ms"


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..1) of a non-empty list."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), int(q * len(ordered) + 0.999999)))
    return ordered[rank - 1]


def summary(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    return {
        "p50": percentile(values, 0.5),
        "p90": percentile(values, 0.9),
        "p99": percentile(values, 0.99),
        "max": max(values),
    }


def latency_figures(seen: list[float]) -> dict[str, dict[str, float]]:
    """A change's times per proxy (seconds from the write) as 'from write' and 'fan-out' (from the
    first proxy's copy: the push once it has started) summaries; nothing when no proxy saw it."""
    if not seen:
        return {}
    first = min(seen)
    return {"from_write_seconds": summary(seen), "fan_out_seconds": summary([t - first for t in seen])}


def host_speed() -> float:
    """Seconds one core takes for ten million additions in a bare loop, the fastest of three.

    Recorded before and after a suite as a rough guide to how busy the host was: a slow loop says
    that other tenants shared the cores. It is not a factor to scale figures by; a push that waits on
    the kernel or on the simulator slows by its own amount."""
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        total = 0
        for i in range(10_000_000):
            total += i
        best = min(best, time.perf_counter() - started)
    return round(best, 3)


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", flush=True)


def fleet_specs(scenario: Scenario) -> list[ProxySpec]:
    """The simulated sidecars of a scenario, with the node metadata they send."""
    out = []
    for i in range(scenario.proxies):
        node_id, ip, namespace, labels = scenario.proxy(i)
        metadata = {
            "NAMESPACE": namespace,
            "LABELS": labels,
            "ISTIO_VERSION": "1.28.0",
            "CLUSTER_ID": "Kubernetes",
            "INSTANCE_IPS": ip,
        }
        out.append(ProxySpec(node_id, metadata))
    return out
