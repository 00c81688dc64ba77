"""Which Telemetry API objects and MeshConfig ``defaultProviders`` apply to a proxy, as istiod resolves them.

istiod (``pilot/pkg/model/telemetry.go``) reads Telemetry objects (``telemetry.istio.io``) in three
scopes, later ones overriding earlier ones: the root namespace's namespace-wide object, the proxy's
namespace's namespace-wide object, then every object of the proxy's namespace whose workload selector
matches the proxy. "Namespace-wide" is the oldest object of the namespace without selector labels
and without ``targetRef(s)``; an object with ``targetRef(s)`` never attaches to a sidecar or a
plain gateway (it targets Kubernetes Gateways and waypoints, which meshpilot does not serve), and
``config/unapplied.py`` counts it.

Three questions are answered here, each as istiod's merge does:

- ``metrics``: per metrics provider, the overrides of each side (client, server), whether a side is
  disabled altogether, and the TCP reporting interval (``networking/stats_filters.py`` turns it into
  ``istio.stats`` filters);
- ``access_logging``: the Telemetry API access loggers of a side (not the legacy ``accessLogFile``);
- ``tracing``: the Telemetry API tracing of both sides (not the legacy ``enableTracing``).

Notes for callers beyond the shared interface: ``LoggingConfig.disabled`` marks a provider a
Telemetry turned off. istiod keeps such entries so that the legacy ``accessLogFile`` path is not
taken, and writes no logger for them: a caller falls back to the legacy path only when no entry
(disabled ones included) gives a logger, as istiod drops the providers it cannot build before it
asks, and skips disabled entries. ``TracingSpec.disable_context_propagation`` is the Telemetry field
of that name.

The resolution is memoized per push context and the objects that apply (never by the labels or
namespace a client sends, which would let clients grow the memo), and what is derived from it per
push context and the objects in scope: it is asked for on every listener of every proxy, and with
no Telemetry object at all it costs one dictionary lookup. Providers named but not defined in
MeshConfig are passed over, as istiod does, and listed by ``undefined_providers`` for the caller to
report.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from meshpilot._proto.istio.telemetry.v1alpha1 import telemetry_pb2
from meshpilot.model.config import Config, ConfigKey
from meshpilot.model.identity import IdentityEnum
from meshpilot.model.kind import Kind
from meshpilot.model.labels import selector_matches
from meshpilot.model.proxy import Proxy
from meshpilot.model.push_context import PushContext

_WorkloadMode = telemetry_pb2.WorkloadMode
_IstioMetric = telemetry_pb2.MetricSelector.IstioMetric
_REMOVE = telemetry_pb2.MetricsOverrides.TagOverride.REMOVE

#: Every predefined metric but ALL_METRICS, sorted by name: ALL_METRICS overrides each of them.
ALL_METRICS: tuple[str, ...] = tuple(
    sorted(name for name in _IstioMetric.keys() if name != "ALL_METRICS")  # noqa: SIM118 (an enum wrapper)
)


class TelemetryClass(IdentityEnum):
    """Which side of the proxy a filter serves (istiod's listener class, gateways being clients)."""

    CLIENT = "client"  # sidecar outbound, and gateways
    SERVER = "server"  # sidecar inbound

    @property
    def mode(self) -> int:
        return _WorkloadMode.CLIENT if self is TelemetryClass.CLIENT else _WorkloadMode.SERVER


@dataclass(frozen=True, slots=True)
class LoggingConfig:
    """One access logging provider in scope (of any kind: ``networking/access_log.py`` decides which
    kinds write a logger, and counts the others)."""

    provider: Any  # MeshConfig.ExtensionProvider
    filter_expression: str | None  # accessLogging.filter.expression (CEL), or None
    #: A Telemetry turned this provider off: write no logger, but do not fall back to the legacy path.
    disabled: bool = False


@dataclass(frozen=True, slots=True)
class TracingSpec:
    provider: Any | None  # MeshConfig.ExtensionProvider, or None
    disabled: bool  # disableSpanReporting, or no provider
    random_sampling_percentage: float | None
    custom_tags: Mapping[str, Any]  # name -> Tracing.CustomTag
    use_request_id_for_trace_sampling: bool
    enable_istio_tags: bool
    disable_context_propagation: bool = False
    #: All of the above, serialized once: part of the keys of what is built from the spec.
    key: tuple[object, ...] = field(init=False)

    def __post_init__(self) -> None:
        key = (
            self.provider.SerializeToString(deterministic=True) if self.provider is not None else None,
            self.disabled,
            self.random_sampling_percentage,
            tuple(sorted((n, t.SerializeToString(deterministic=True)) for n, t in self.custom_tags.items())),
            self.use_request_id_for_trace_sampling,
            self.enable_istio_tags,
            self.disable_context_propagation,
        )
        object.__setattr__(self, "key", key)


@dataclass(frozen=True, slots=True)
class TracingConfig:
    client: TracingSpec
    server: TracingSpec


@dataclass(frozen=True, slots=True)
class TagOverride:
    name: str
    remove: bool
    value: str


@dataclass(frozen=True, slots=True)
class MetricOverride:
    """What a Telemetry says of one metric (a predefined one by its enum name, or a custom one)."""

    name: str
    disabled: bool
    tags: tuple[TagOverride, ...]


@dataclass(frozen=True, slots=True)
class SideMetrics:
    #: No metrics on this side: the provider's filter is left out.
    disabled: bool = False
    overrides: tuple[MetricOverride, ...] = ()


@dataclass(frozen=True, slots=True)
class ProviderMetrics:
    """One metrics provider's merged configuration."""

    provider: Any  # MeshConfig.ExtensionProvider
    client: SideMetrics
    server: SideMetrics
    reporting_interval: Any | None  # google.protobuf.Duration

    def side(self, cls: TelemetryClass) -> SideMetrics:
        return self.client if cls is TelemetryClass.CLIENT else self.server


@dataclass(frozen=True, slots=True)
class Applicable:
    """The Telemetry objects in scope for a proxy, root first (istiod's computedTelemetries)."""

    #: Every contributing object with its spec hash, in scope order: what the results read, so
    #: the key of every cache of them (here, and of the listeners that carry them).
    fingerprint: tuple[tuple[ConfigKey, int], ...] = ()
    metrics: tuple[Any, ...] = ()
    #: The accessLogging lists, one per contributing object.
    logging: tuple[tuple[Any, ...], ...] = ()
    tracing: tuple[Any, ...] = ()


_NOTHING = Applicable()


@dataclass(slots=True)
class _Index:
    by_namespace: dict[str, list[Config]] = field(default_factory=lambda: defaultdict(list))
    #: Per namespace, its objects with a workload selector (the ones a proxy's labels choose among).
    selecting: dict[str, tuple[Config, ...]] = field(default_factory=dict)
    #: Derived results, per Applicable key and question: shared by every proxy with the same scope.
    derived: dict[Any, Any] = field(default_factory=dict)


def _order(config: Config) -> tuple[str, str, str]:
    return (config.meta.creation_timestamp or "~", config.namespace, config.name)


def _index(push: PushContext) -> _Index:
    def build() -> _Index:
        index = _Index()
        for config in sorted(push.configs(Kind.TELEMETRY), key=_order):
            index.by_namespace[config.namespace].append(config)
        for namespace, configs in index.by_namespace.items():
            index.selecting[namespace] = tuple(
                c for c in configs if not is_namespace_wide(c.spec) and not targets_refs(c.spec)
            )
        return index

    return push.memoized(("telemetry-index",), build)


def targets_refs(spec: Any) -> bool:
    return spec.HasField("targetRef") or len(spec.targetRefs) > 0


def is_namespace_wide(spec: Any) -> bool:
    return not spec.selector.match_labels and not targets_refs(spec)


def _namespace_wide(index: _Index, namespace: str) -> Config | None:
    for config in index.by_namespace.get(namespace, ()):
        if is_namespace_wide(config.spec):
            return config
    return None


def applicable(push: PushContext, proxy: Proxy) -> Applicable:
    """The Telemetry objects that apply to ``proxy`` (istiod's applicableTelemetries): worked out once
    per proxy state and snapshot, as the filters that read telemetry each ask for them."""
    return proxy.state.derived(push, "telemetry", lambda: _applicable(push, proxy))


def _applicable(push: PushContext, proxy: Proxy) -> Applicable:
    index = _index(push)
    if not index.by_namespace:
        return _NOTHING
    # Keyed by what decides the answer (which selecting objects match), not by the namespace and
    # labels themselves: a client may send any, and the memo must not grow with them. A namespace
    # without Telemetry objects is answered as any other such namespace (the root's alone).
    namespace = proxy.config_namespace
    if namespace not in index.by_namespace:
        namespace = ""
    labels = proxy.labels
    chosen = tuple(
        c
        for c in index.selecting.get(namespace, ())
        if selector_matches(c.spec.selector.match_labels, labels)
    )
    key = ("telemetry-applicable", namespace, tuple(c.key for c in chosen))
    return push.memoized(key, lambda: _resolve(index, push.mesh.root_namespace, namespace, chosen))


def _resolve(index: _Index, root: str, namespace: str, chosen: tuple[Config, ...]) -> Applicable:
    found: list[Config] = []
    if root:
        config = _namespace_wide(index, root)
        if config is not None:
            found.append(config)
    if namespace and namespace != root:
        config = _namespace_wide(index, namespace)
        if config is not None:
            found.append(config)
    found.extend(chosen)
    if not found:
        return _NOTHING
    return Applicable(
        fingerprint=tuple((c.key, c.spec_hash) for c in found),
        metrics=tuple(m for c in found for m in c.spec.metrics),
        logging=tuple(tuple(c.spec.access_logging) for c in found if c.spec.access_logging),
        tracing=tuple(t for c in found for t in c.spec.tracing),
    )


def fingerprint(push: PushContext, proxy: Proxy) -> tuple[tuple[ConfigKey, int], ...]:
    """What of the Telemetry objects decides ``proxy``'s telemetry: part of its listeners' cache keys."""
    return applicable(push, proxy).fingerprint


def derived(push: PushContext, scope: Applicable, question: Any, make: Any) -> Any:
    """``make()`` once per push for the objects in scope and ``question`` (istiod's computed caches)."""
    cache = _index(push).derived
    key = (scope.fingerprint, question)
    try:
        return cache[key]
    except KeyError:
        value = cache[key] = make()
        return value


def provider(push: PushContext, name: str) -> Any | None:
    """The MeshConfig extension provider of that name (case-insensitive, as istiod looks it up)."""
    wanted = name.lower()
    for candidate in push.mesh.extension_providers:
        if candidate.name.lower() == wanted:
            return candidate
    return None


def _names(refs: Any) -> list[str]:
    return [ref.name for ref in refs]


def undefined_providers(push: PushContext, proxy: Proxy) -> tuple[tuple[str, str], ...]:
    """(field, name) of every provider that ``defaultProviders`` or a Telemetry object in scope of
    ``proxy`` names under ``metrics``, ``accessLogging`` or ``tracing`` and MeshConfig does not define.

    istiod passes over them (an unknown metrics or logging provider is left out, an unknown tracing
    provider leaves tracing off), and so do the questions here; the caller reports them.
    """
    scope = applicable(push, proxy)
    found: tuple[tuple[str, str], ...] = derived(push, scope, "undefined", lambda: _undefined(push, scope))
    return found


def _undefined(push: PushContext, scope: Applicable) -> tuple[tuple[str, str], ...]:
    defaults = push.mesh.default_providers
    named: set[tuple[str, str]] = set()
    named.update(("metrics", n) for n in defaults.metrics)
    named.update(("accessLogging", n) for n in defaults.access_logging)
    named.update(("tracing", n) for n in defaults.tracing)
    named.update(("metrics", n) for entry in scope.metrics for n in _names(entry.providers))
    named.update(
        ("accessLogging", n)
        for entries in scope.logging
        for entry in entries
        for n in _names(entry.providers)
    )
    named.update(("tracing", n) for entry in scope.tracing for n in _names(entry.providers))
    return tuple(sorted(pair for pair in named if provider(push, pair[1]) is None))


# -- metrics ---------------------------------------------------------------------------------------


def _modes(mode: int) -> tuple[int, ...]:
    if mode in (_WorkloadMode.CLIENT, _WorkloadMode.SERVER):
        return (mode,)
    return (_WorkloadMode.CLIENT, _WorkloadMode.SERVER)


def _selects_all(selector: Any) -> bool:
    which = selector.WhichOneof("metric_match")
    if which == "custom_metric":
        return False
    return which is None or selector.metric == _IstioMetric.ALL_METRICS


def _matches(selector: Any) -> tuple[str, ...]:
    which = selector.WhichOneof("metric_match")
    if which == "custom_metric":
        return (selector.custom_metric,)
    if which is None or selector.metric == _IstioMetric.ALL_METRICS:
        return ALL_METRICS
    return (_IstioMetric.Name(selector.metric),)


def metrics(push: PushContext, proxy: Proxy) -> tuple[ProviderMetrics, ...]:
    """The metrics providers that apply to ``proxy``, by name, each with its merged overrides."""
    scope = applicable(push, proxy)
    found: tuple[ProviderMetrics, ...] = derived(push, scope, "metrics", lambda: _merge_metrics(push, scope))
    return found


def _merge_metrics(push: PushContext, scope: Applicable) -> tuple[ProviderMetrics, ...]:
    # provider -> mode -> metric -> [disabled (None: unset), {tag: TagOverride message}]
    providers: dict[str, dict[int, dict[str, list[Any]]]] = {}
    defaults = list(push.mesh.default_providers.metrics)
    if not scope.metrics:
        for name in defaults:
            providers[name] = {}
    in_scope = list(defaults)
    for entry in scope.metrics:
        names = _names(entry.providers)
        if names:
            in_scope = names
    wanted = set(in_scope)

    parent = defaults
    all_disabled: set[tuple[str, int]] = set()
    intervals: dict[str, Any] = {}
    for entry in scope.metrics:
        names = _names(entry.providers) or parent
        parent = names
        for name in names:
            if name not in wanted:
                continue  # a parent's provider a lower scope replaced
            if entry.HasField("reporting_interval"):
                intervals[name] = entry.reporting_interval
            modes = providers.setdefault(name, {_WorkloadMode.CLIENT: {}, _WorkloadMode.SERVER: {}})
            for override in entry.overrides:
                selector = override.match
                if _selects_all(selector) and override.HasField("disabled") and override.disabled.value:
                    all_disabled.update((name, mode) for mode in _modes(selector.mode))
                    continue
                for mode in _modes(selector.mode):
                    all_disabled.discard((name, mode))
                    by_metric = modes.setdefault(mode, {})
                    for metric in _matches(selector):
                        state = by_metric.setdefault(metric, [None, {}])
                        if override.HasField("disabled"):
                            state[0] = override.disabled.value
                        state[1].update(override.tag_overrides)

    out: list[ProviderMetrics] = []
    for name in sorted(providers):
        found = provider(push, name)
        if found is None:
            continue
        sides: dict[int, SideMetrics] = {}
        for mode in (_WorkloadMode.CLIENT, _WorkloadMode.SERVER):
            if (name, mode) in all_disabled and mode in providers[name]:
                sides[mode] = SideMetrics(disabled=True)
                continue
            overrides = tuple(
                MetricOverride(
                    metric,
                    bool(disabled),
                    tuple(
                        TagOverride(tag, op.operation == _REMOVE, "" if op.operation == _REMOVE else op.value)
                        for tag, op in sorted(tags.items())
                    ),
                )
                for metric, (disabled, tags) in sorted(providers[name].get(mode, {}).items())
            )
            sides[mode] = SideMetrics(overrides=overrides)
        out.append(
            ProviderMetrics(
                found, sides[_WorkloadMode.CLIENT], sides[_WorkloadMode.SERVER], intervals.get(name)
            )
        )
    return tuple(out)


# -- access logging --------------------------------------------------------------------------------


def _mode_matches(entry: Any, mode: int) -> bool:
    if not entry.HasField("match"):
        return True
    return entry.match.mode in (_WorkloadMode.CLIENT_AND_SERVER, mode)


def access_logging(push: PushContext, proxy: Proxy, cls: TelemetryClass) -> list[LoggingConfig]:
    """Telemetry API access logging providers (and ``defaultProviders.accessLogging``) of one side
    of ``proxy``, each defined in MeshConfig (of any kind).

    Empty when neither configures any: the legacy MeshConfig ``accessLogFile`` path applies then.
    """
    scope = applicable(push, proxy)
    if not scope.logging and not push.mesh.default_providers.access_logging:
        return []
    found: list[LoggingConfig] = derived(push, scope, ("logging", cls), lambda: _merge_logs(push, scope, cls))
    return found


def _merge_logs(push: PushContext, scope: Applicable, cls: TelemetryClass) -> list[LoggingConfig]:
    mode = cls.mode
    defaults = list(push.mesh.default_providers.access_logging)
    # provider -> (disabled, filter expression)
    chosen: dict[str, tuple[bool, str | None]] = {}
    if not scope.logging:
        chosen = dict.fromkeys(defaults, (False, None))
    else:
        in_scope = list(defaults)
        filters: dict[str, str | None] = {}
        for entries in scope.logging:
            names: list[str] = []
            for entry in entries:
                if not _mode_matches(entry, mode):
                    continue
                for name in _names(entry.providers):
                    if name not in names:
                        names.append(name)
                    filters[name] = entry.filter.expression if entry.HasField("filter") else None
            if names:
                in_scope = names
        wanted = set(in_scope)
        parent = defaults
        for entries in scope.logging:
            for entry in entries:
                names = _names(entry.providers) or parent
                parent = names
                for name in names:
                    if name not in wanted or not _mode_matches(entry, mode):
                        continue
                    if entry.HasField("disabled") and entry.disabled.value:
                        chosen[name] = (True, None)
                    else:
                        chosen[name] = (False, filters.get(name))
    out = []
    for name, (disabled, expression) in chosen.items():
        found = provider(push, name)
        if found is not None:  # an undefined one is in undefined_providers()
            out.append(LoggingConfig(found, expression, disabled))
    out.sort(key=lambda c: str(c.provider.name))
    return out


# -- tracing ---------------------------------------------------------------------------------------


def tracing(push: PushContext, proxy: Proxy) -> TracingConfig | None:
    """Telemetry API tracing (and ``defaultProviders.tracing``) of ``proxy``.

    None when neither configures tracing: the legacy MeshConfig ``enableTracing`` path applies then.
    """
    scope = applicable(push, proxy)
    if not scope.tracing and not push.mesh.default_providers.tracing:
        return None
    found: TracingConfig = derived(push, scope, "tracing", lambda: _merge_tracing(push, scope))
    return found


def _merge_tracing(push: PushContext, scope: Applicable) -> TracingConfig:
    start: dict[str, Any] = {
        "provider": None,
        "disabled": False,
        "random_sampling_percentage": None,
        "custom_tags": {},
        "use_request_id_for_trace_sampling": True,
        "enable_istio_tags": True,
        "disable_context_propagation": False,
    }
    client, server = dict(start), dict(start)
    defaults = list(push.mesh.default_providers.tracing)
    if defaults:
        # istiod uses the first default provider only.
        client["provider"] = server["provider"] = provider(push, defaults[0])
    for entry in scope.tracing:
        specs = [client, server]
        if entry.HasField("match"):
            if entry.match.mode == _WorkloadMode.CLIENT:
                specs = [client]
            elif entry.match.mode == _WorkloadMode.SERVER:
                specs = [server]
        names = _names(entry.providers)
        updates: dict[str, Any] = {}
        if names:
            updates["provider"] = provider(push, names[0])
        if entry.HasField("disable_span_reporting"):
            updates["disabled"] = entry.disable_span_reporting.value
        if entry.custom_tags:
            # A shallow merge, as istiod's: the last object naming tags replaces the earlier ones.
            updates["custom_tags"] = dict(entry.custom_tags)
        if entry.HasField("random_sampling_percentage"):
            updates["random_sampling_percentage"] = entry.random_sampling_percentage.value
        if entry.HasField("use_request_id_for_trace_sampling"):
            updates["use_request_id_for_trace_sampling"] = entry.use_request_id_for_trace_sampling.value
        if entry.HasField("enable_istio_tags"):
            updates["enable_istio_tags"] = entry.enable_istio_tags.value
        if entry.HasField("disable_context_propagation"):
            updates["disable_context_propagation"] = entry.disable_context_propagation.value
        for spec in specs:
            spec.update(updates)
    for spec in (client, server):
        if spec["provider"] is None:
            spec["disabled"] = True
    return TracingConfig(client=TracingSpec(**client), server=TracingSpec(**server))


def unapplied(config: Config) -> str | None:
    """What of a Telemetry object meshpilot does not apply (``config/unapplied.py``), or None.

    ``targetRef(s)`` attach a Telemetry to Kubernetes Gateways, waypoints or services through them,
    none of which meshpilot serves, so such an object applies to no proxy (as istiod ignores it for
    sidecars and Istio gateways).
    """
    if targets_refs(config.spec):
        return "targetRef/targetRefs attach it to Kubernetes Gateways or waypoints only: no proxy takes it"
    return None
