"""Prometheus metrics with istiod's names.

istiod exports counters without the ``_total`` suffix (its exporter is set up
that way), and dashboards query those names, so the exposition here renames
prometheus-client's counters back to the istiod names.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    ProcessCollector,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from meshpilot import __version__
from meshpilot.server.counters import CounterChild, PlainCounter
from meshpilot.server.histograms import HistogramChild, PlainHistogram

# istiod exports no "<name>_created" series for counters and histograms; prometheus-client's switch
# for that is process-wide, and every metric of this process is meshpilot's.
disable_created_metrics()  # type: ignore[no-untyped-call]

# Push and convergence latencies span from milliseconds to tens of seconds.
_LATENCY_BUCKETS = (0.01, 0.1, 0.5, 1, 3, 5, 10, 20, 30)
_SIZE_BUCKETS = (1, 10000, 1000000, 4000000, 10000000, 40000000)


@dataclass(frozen=True, slots=True)
class TypeMetrics:
    """The labelled push metrics of one xDS type."""

    pushes: CounterChild
    unchanged_skipped: CounterChild
    delta_kept: CounterChild
    push_time: HistogramChild
    config_size: HistogramChild


class Metrics:
    """Every metric meshpilot exports, bound to one registry (no process globals)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self._by_type: dict[str, TypeMetrics] = {}
        self.registry = registry or CollectorRegistry(auto_describe=True)
        r = self.registry
        # What the control-plane dashboard reads besides pilot_*: the build (one series, 1) and
        # the process (process_cpu_seconds_total, process_resident_memory_bytes, ...); and the
        # collector's work (python_gc_*): full collections are rare and long (server.gc_tuning).
        self.build = Gauge("istio_build", "Istio component build info", ["component", "tag"], registry=r)
        self.build.labels(component="pilot", tag=__version__).set(1)
        ProcessCollector(registry=r)
        GCCollector(registry=r)
        self.xds_clients = Gauge(
            "pilot_xds", "Number of endpoints connected to this pilot using XDS.", ["version"], registry=r
        )
        # Counted for every proxy of every push: in plain integers (``server.counters``).
        self.xds_pushes = PlainCounter(
            "pilot_xds_pushes", "Pilot build and send errors for lds, rds, cds and eds.", ["type"], registry=r
        )
        self.unchanged_skipped = PlainCounter(
            "meshpilot_xds_unchanged_skipped",
            "Pushes not sent because the proxy already holds exactly that configuration.",
            ["type"],
            registry=r,
        )
        self.delta_kept = PlainCounter(
            "meshpilot_xds_delta_resources_kept",
            "Resources a delta response left out because the proxy holds them as they are "
            "(a push or a reconnect with initial_resource_versions) (meshpilot only).",
            ["type"],
            registry=r,
        )
        self.xds_refused = Counter(
            "meshpilot_xds_refused_requests",
            "xDS requests refused: names too long, too many subscriptions, unknown types, malformed "
            "messages (meshpilot only).",
            ["reason"],
            registry=r,
        )
        self.xds_rejects = Counter(
            "pilot_total_xds_rejects",
            "Total number of XDS responses from pilot rejected by proxy.",
            ["type"],
            registry=r,
        )
        self.expired_nonce = Counter(
            "pilot_xds_expired_nonce",
            "Total number of XDS requests with an expired nonce.",
            ["type"],
            registry=r,
        )
        self.internal_errors = Counter(
            "pilot_total_xds_internal_errors", "Total number of internal XDS errors in pilot.", registry=r
        )
        # Observed for every proxy of every push: counted in plain integers (``server.histograms``).
        self.convergence_time = PlainHistogram(
            "pilot_proxy_convergence_time",
            "Delay in seconds between config change and a proxy receiving all required configuration.",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.queue_time = PlainHistogram(
            "pilot_proxy_queue_time",
            "Time in seconds, a proxy is in the push queue before being dequeued.",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.push_time = PlainHistogram(
            "pilot_xds_push_time",
            "Total time in seconds Pilot takes to push lds, rds, cds and eds.",
            ["type"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.send_time = PlainHistogram(
            "pilot_xds_send_time",
            "Total time in seconds Pilot takes to send generated configuration.",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.config_size = PlainHistogram(
            "pilot_xds_config_size_bytes",
            "Distribution of configuration sizes pushed to clients",
            ["type"],
            buckets=_SIZE_BUCKETS,
            registry=r,
        )
        self.debounce_time = Histogram(
            "pilot_debounce_time",
            "Delay in seconds between the first config enters "
            "debouncing and the merged push request is pushed into the push queue.",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.pushcontext_init = Histogram(
            "pilot_pushcontext_init_seconds",
            "Total time in seconds Pilot takes to init pushContext.",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.services = Gauge("pilot_services", "Total services known to pilot.", registry=r)
        self.virtual_services = Gauge(
            "pilot_virt_services", "Total virtual services known to pilot.", registry=r
        )
        self.inbound_updates = Counter(
            "pilot_inbound_updates", "Total number of updates received by pilot.", ["type"], registry=r
        )
        self.push_triggers = Counter(
            "pilot_push_triggers",
            "Total number of times a push was triggered, labeled by reason for the push.",
            ["type"],
            registry=r,
        )
        self.cache_reads = CacheReads()
        r.register(self.cache_reads)
        self.cache_evictions = Counter(
            "xds_cache_evictions", "Total number of xds cache evictions.", ["type"], registry=r
        )
        self.cache_size = Gauge("xds_cache_size", "Current size of xds cache", registry=r)
        self.cache_dependent_configs = Gauge(
            "xds_cache_dependent_config_size", "Current size of dependent configs", registry=r
        )
        self.cache_mismatches = Counter(
            "meshpilot_xds_cache_mismatches",
            "Cache hits that differ from a fresh build, found with UNSAFE_PILOT_ENABLE_RUNTIME_ASSERTIONS "
            "(meshpilot only).",
            ["type"],
            registry=r,
        )
        self.rate_limited = Counter(
            "meshpilot_xds_rate_limited",
            "New xDS streams refused by the request rate limit (meshpilot only).",
            registry=r,
        )
        self.xds_auth_failures = Counter(
            "meshpilot_xds_auth_failures",
            "xDS streams refused on the secure port: no credential proved an identity "
            "(authentication) or none matched the proxy's namespace and service account "
            "(authorization) (meshpilot only).",
            ["reason"],
            registry=r,
        )
        self.config_rejections = Gauge(
            "meshpilot_config_rejected_objects",
            "Config objects currently rejected by the config directory loader (meshpilot only).",
            registry=r,
        )
        self.unimplemented_settings = Gauge(
            "meshpilot_unimplemented_settings",
            "istiod flags and environment variables set for this server that it accepts but does not "
            "implement, 1 each by name (meshpilot only).",
            ["name"],
            registry=r,
        )

        # The validation webhook's counters, labelled as istiod labels them.
        self.validation_passed = Counter(
            "galley_validation_passed",
            "Resource is valid",
            ["group", "version", "resource"],
            registry=r,
        )
        self.validation_failed = Counter(
            "galley_validation_failed",
            "Resource validation failed",
            ["group", "version", "resource", "reason"],
            registry=r,
        )
        self.validation_http_error = Counter(
            "galley_validation_http_error", "Resource validation http serve errors", ["status"], registry=r
        )

    def for_type(self, short: str) -> TypeMetrics:
        """The per-type children of the push metrics (``labels()`` costs microseconds per call)."""
        found = self._by_type.get(short)
        if found is None:
            found = self._by_type[short] = TypeMetrics(
                pushes=self.xds_pushes.labels(type=short),
                unchanged_skipped=self.unchanged_skipped.labels(type=short),
                delta_kept=self.delta_kept.labels(type=short),
                push_time=self.push_time.labels(type=short),
                config_size=self.config_size.labels(type=short),
            )
        return found

    def register(self, collector: Collector) -> None:
        self.registry.register(collector)

    def exposition(self) -> bytes:
        return exposition(self.registry)


class CacheReads(Collector):
    """istiod's ``xds_cache_reads`` counter, counted in plain integers.

    A cache read is a few dict operations; a prometheus_client counter takes a lock on every
    increment, which cost more than the read (7% of a VirtualService push that regenerates every
    scope's clusters from the cache, profiled). Reads happen on the event loop's thread only. As
    istiod's, a type's series appears with its first count.
    """

    def __init__(self) -> None:
        self.hit = 0
        self.miss = 0

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(
            "xds_cache_reads", "Total number of xds cache xdsCacheReads.", labels=["type"]
        )
        for kind, count in (("hit", self.hit), ("miss", self.miss)):
            if count:
                family.add_metric([kind], count)
        yield family


def exposition(registry: CollectorRegistry) -> bytes:
    """Prometheus text format, counters under their istiod names."""
    text = generate_latest(registry).decode()
    return _rename_counters(text, registry).encode()


# Counters istiod itself names with "_total" (the injector's, SDS's, the process collector's
# process_cpu_seconds_total), and the Python collector's, which istiod has no name for: they keep the
# suffix.
_KEEP_TOTAL_PREFIXES = ("sidecar_injection_", "pilot_sds_certificate_errors", "process_", "python_gc_")


def _rename_counters(text: str, registry: CollectorRegistry) -> str:
    """``<name>_total`` becomes ``<name>`` (except the counters istiod itself names with it)."""
    counters = [
        m.name
        for m in registry.collect()
        if m.type == "counter" and not m.name.startswith(_KEEP_TOTAL_PREFIXES)
    ]
    if not counters:
        return text
    names = "|".join(re.escape(n) for n in counters)
    return re.sub(rf"^(# (?:HELP|TYPE) )?({names})_total\b", r"\1\2", text, flags=re.MULTILINE)
