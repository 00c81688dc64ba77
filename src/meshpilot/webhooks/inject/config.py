"""The injector's configuration: the ``config`` and ``values`` keys of the ``istio-sidecar-injector``
ConfigMap, read from a directory holding one file per key."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

# istiod's initializer.go: namespaces whose pods are never injected, besides istiod's own.
SYSTEM_NAMESPACES = ("kube-system", "kube-public", "kube-node-lease", "local-path-storage")


class InjectionError(Exception):
    """Bad injector configuration, bad annotations on a pod, or a template that cannot be rendered."""


# The chart's defaults for the values the built-in sidecar template reads (istio-discovery values.yaml).
DEFAULT_VALUES: dict[str, Any] = {
    "revision": "",
    "global": {
        "hub": "docker.io/istio",
        "tag": "1.28.0",
        "istioNamespace": "istio-system",
        "pilotCertProvider": "istiod",
        "caAddress": "",
        "trustDomain": "",
        "meshID": "",
        "network": "",
        "imagePullPolicy": "",
        "imagePullSecrets": [],
        "logging": {"level": "default:info"},
        "multiCluster": {"clusterName": ""},
        "sds": {"token": {"aud": "istio-ca"}},
        "proxy": {
            "image": "proxyv2",
            "clusterDomain": "cluster.local",
            "logLevel": "warning",
            "componentLogLevel": "misc:error",
            "includeIPRanges": "*",
            "excludeIPRanges": "",
            "includeInboundPorts": "*",
            "excludeInboundPorts": "",
            "includeOutboundPorts": "",
            "excludeOutboundPorts": "",
            "statusPort": 15020,
            "privileged": False,
            "holdApplicationUntilProxyStarts": False,
            "readinessInitialDelaySeconds": 0,
            "readinessPeriodSeconds": 15,
            "readinessFailureThreshold": 4,
            "startupProbe": {"enabled": True, "failureThreshold": 600},
            "resources": {
                "requests": {"cpu": "100m", "memory": "128Mi"},
                "limits": {"cpu": "2", "memory": "1Gi"},
            },
        },
        "proxy_init": {"image": "proxyv2"},
    },
    "sidecarInjectorWebhook": {"rewriteAppHTTPProbe": True},
    "meshConfig": {"trustDomain": "cluster.local"},
}


def _deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


@dataclass(frozen=True)
class InjectConfig:
    """What istiod's ``inject.Config`` holds, plus the merged values."""

    policy: str = "enabled"
    always_inject_selector: tuple[dict[str, Any], ...] = ()
    never_inject_selector: tuple[dict[str, Any], ...] = ()
    injected_annotations: dict[str, str] = field(default_factory=dict)
    templates: dict[str, str] = field(default_factory=dict)
    default_templates: tuple[str, ...] = ("sidecar",)
    aliases: dict[str, tuple[str, ...]] = field(default_factory=dict)
    values: dict[str, Any] = field(default_factory=lambda: copy.deepcopy(DEFAULT_VALUES))

    @property
    def istio_namespace(self) -> str:
        return str(self.values["global"]["istioNamespace"])

    @property
    def ignored_namespaces(self) -> tuple[str, ...]:
        return (*SYSTEM_NAMESPACES, self.istio_namespace)

    @property
    def revision(self) -> str:
        return str(self.values.get("revision") or "default")


def _mapping(text: str, what: str) -> dict[str, Any]:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise InjectionError(f"{what}: not valid YAML: {err}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise InjectionError(f"{what}: expected a mapping, got {type(data).__name__}")
    return data


def _selectors(raw: Any, what: str) -> tuple[dict[str, Any], ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list) or not all(isinstance(s, dict) for s in raw):
        raise InjectionError(f"config: {what} must be a list of label selectors")
    for selector in raw:
        labels = selector.get("matchLabels") or {}
        expressions = selector.get("matchExpressions") or []
        if not isinstance(labels, dict):
            raise InjectionError(f"config: {what}: matchLabels must be a mapping")
        if not isinstance(expressions, list) or not all(
            isinstance(e, dict) and isinstance(e.get("values") or [], list) for e in expressions
        ):
            raise InjectionError(
                f"config: {what}: matchExpressions must be a list of {{key, operator, values}}"
            )
    return tuple(raw)


# The mappings the built-in template reads; a values file that replaces one with a scalar or null
# would otherwise fail in the middle of an injection.
_VALUE_MAPPINGS = (
    ("global",),
    ("global", "proxy"),
    ("global", "proxy", "startupProbe"),
    ("global", "proxy_init"),
    ("global", "logging"),
    ("global", "multiCluster"),
    ("global", "sds"),
    ("global", "sds", "token"),
    ("meshConfig",),
    ("sidecarInjectorWebhook",),
)


def _check_values(values: dict[str, Any]) -> None:
    for path in _VALUE_MAPPINGS:
        node: Any = values
        for key in path:
            node = node.get(key) if isinstance(node, dict) else None
        if not isinstance(node, dict):
            raise InjectionError(f"values: {'.'.join(path)} must be a mapping")
    proxy = values["global"]["proxy"]
    for key, value in (
        ("statusPort", proxy.get("statusPort")),
        ("startupProbe.failureThreshold", proxy["startupProbe"].get("failureThreshold")),
    ):
        if isinstance(value, bool) or not str(value).isdigit():
            raise InjectionError(f"values: global.proxy.{key} must be a non-negative integer, got {value!r}")
    resources = values["global"]["proxy"].get("resources")
    if resources is not None and not isinstance(resources, dict):
        raise InjectionError("values: global.proxy.resources must be a mapping")


def parse_config(config_text: str, values_text: str = "") -> InjectConfig:
    """Builds an InjectConfig from the text of the ConfigMap's ``config`` and ``values`` keys."""
    raw = _mapping(config_text, "config")
    values = _mapping(values_text, "values")
    policy = str(raw.get("policy", "enabled"))
    templates = raw.get("templates") or {}
    if not isinstance(templates, dict) or not all(isinstance(v, str) for v in templates.values()):
        raise InjectionError("config: templates must map names to template text")
    defaults = raw.get("defaultTemplates") or ["sidecar"]
    if not isinstance(defaults, list):
        raise InjectionError("config: defaultTemplates must be a list of names")
    aliases = raw.get("aliases") or {}
    if not isinstance(aliases, dict) or not all(isinstance(v, list) for v in aliases.values()):
        raise InjectionError("config: aliases must map names to lists of names")
    annotations = raw.get("injectedAnnotations") or {}
    if not isinstance(annotations, dict):
        raise InjectionError("config: injectedAnnotations must be a mapping")
    merged_values = _deep_merge(DEFAULT_VALUES, values)
    _check_values(merged_values)
    return InjectConfig(
        policy=policy,
        always_inject_selector=_selectors(raw.get("alwaysInjectSelector"), "alwaysInjectSelector"),
        never_inject_selector=_selectors(raw.get("neverInjectSelector"), "neverInjectSelector"),
        injected_annotations={str(k): str(v) for k, v in annotations.items()},
        templates={str(k): v for k, v in templates.items()},
        default_templates=tuple(str(d) for d in defaults),
        aliases={str(k): tuple(str(x) for x in v) for k, v in aliases.items()},
        values=merged_values,
    )


def load_config_dir(directory: Path) -> InjectConfig:
    """Reads ``DIR/config`` (required) and ``DIR/values`` (optional), as istiod mounts the ConfigMap."""
    try:
        config_text = (directory / "config").read_text()
    except OSError as err:
        raise InjectionError(f"cannot read injector config: {err}") from None
    values_path = directory / "values"
    try:
        values_text = values_path.read_text() if values_path.exists() else ""
    except OSError as err:
        raise InjectionError(f"cannot read injector values: {err}") from None
    return parse_config(config_text, values_text)
