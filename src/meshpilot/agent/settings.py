"""What ``pilot-agent proxy`` reads before it starts anything, parsed once into :class:`AgentSettings`.

Inputs, as in a pod (paths relative to the working directory, which stands in for the container's root):

- flags (``command.py``): ``proxy sidecar|router``, ``--domain``, ``--meshConfig``, ``--proxyLogLevel``,
  ``--proxyComponentLogLevel``, ``--serviceCluster``, ``--concurrency``, ``--templateFile``;
- the environment the injector writes: ``POD_NAME``, ``POD_NAMESPACE``, ``INSTANCE_IP``,
  ``SERVICE_ACCOUNT``, ``HOST_IP``, ``PROXY_CONFIG``, ``CA_ADDR``, ``ISTIOD_SAN``, ``XDS_ROOT_CA``,
  ``ISTIO_DELTA_XDS``, ``ISTIO_KUBE_APP_PROBERS``, ``ENVOY_STATUS_PORT``, ``ENVOY_PROMETHEUS_PORT``,
  ``ISTIO_CPU_LIMIT``, ``ISTIO_META_*`` and ``ISTIO_METAJSON_*``;
- the podinfo files ``./etc/istio/pod/labels`` and ``./etc/istio/pod/annotations`` (downward API).

The ProxyConfig is merged as pilot-agent merges it: its defaults, then the mesh file's ``defaultConfig``,
then ``PROXY_CONFIG``, then the ``proxy.istio.io/config`` annotation. A field present in a later layer
replaces the earlier one; messages merge field by field, lists are replaced, ``proxyMetadata`` maps merge,
and a tracer set by a later layer replaces the earlier layer's (the tracer is a oneof).
Then the ``sidecar.istio.io/discoveryAddress`` and ``status.sidecar.istio.io/port`` annotations apply,
and the ``tracing`` section is checked as pilot-agent checks it (a bad collector address stops the agent).
The ProxyConfig is kept as its JSON form (camelCase keys, durations as ``"45s"``), which is also what
the node metadata's ``PROXY_CONFIG`` carries.
"""

from __future__ import annotations

import ipaddress
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from google.protobuf import json_format

from meshpilot._proto.istio.mesh.v1alpha1 import proxy_pb2

# The one check of a tracing section, which MeshConfig validation also runs on defaultConfig.
from meshpilot.config.validation.mesh import _tracing_errors as tracing_errors

#: The Istio release whose agent this one stands in for; sent as ISTIO_VERSION, which istiod (and
#: meshpilot) gate behaviour on, unless ``ISTIO_META_ISTIO_VERSION`` says otherwise.
ISTIO_VERSION = "1.31-dev"

#: pilot-agent's ProxyConfig defaults (``mesh.DefaultProxyConfig``), in JSON form.
DEFAULT_PROXY_CONFIG: Mapping[str, Any] = {
    "configPath": "./etc/istio/proxy",
    "binaryPath": "/usr/local/bin/envoy",
    "serviceCluster": "istio-proxy",
    "drainDuration": "45s",
    "terminationDrainDuration": "5s",
    "proxyAdminPort": 15000,
    "controlPlaneAuthPolicy": "MUTUAL_TLS",
    "discoveryAddress": "istiod.istio-system.svc:15012",
    "statNameLength": 189,
    "statusPort": 15020,
}

PODINFO_LABELS = Path("etc/istio/pod/labels")
PODINFO_ANNOTATIONS = Path("etc/istio/pod/annotations")
TOKEN_PATH = Path("var/run/secrets/tokens/istio-token")
#: Where istiod's root may be, first found wins (after ``XDS_ROOT_CA``).
XDS_ROOT_CANDIDATES = (Path("etc/certs/root-cert.pem"), Path("var/run/secrets/istio/root-cert.pem"))
WORKLOAD_CREDENTIALS_DIR = Path("var/run/secrets/workload-spiffe-credentials")
WORKLOAD_SOCKET_DIR = Path("var/run/secrets/workload-spiffe-uds")
PROXY_CONFIG_ANNOTATION = "proxy.istio.io/config"
DISCOVERY_ADDRESS_ANNOTATION = "sidecar.istio.io/discoveryAddress"
STATUS_PORT_ANNOTATION = "status.sidecar.istio.io/port"
#: The ReplicaSet's hash label, which pilot-agent leaves out of LABELS.
POD_TEMPLATE_HASH = "pod-template-hash"
LOCALITY_LABELS = ("topology.istio.io/locality", "istio-locality")
APP_LABELS = ("app", "app.kubernetes.io/name", "service.istio.io/canonical-name")
CANONICAL_NAME_LABELS = ("service.istio.io/canonical-name", "app.kubernetes.io/name", "app")
NODE_TYPES = ("sidecar", "router")
#: ProxyConfig messages holding a oneof, with its members (JSON names).
ONEOFS: Mapping[str, frozenset[str]] = {
    "tracing": frozenset({"zipkin", "lightstep", "datadog", "stackdriver", "openCensusAgent"}),
}
#: ProxyConfig fields that are wrapper messages in the proto: present even when zero.
WRAPPER_FIELDS = frozenset({"concurrency", "holdApplicationUntilProxyStarts", "statsCompression"})


class SettingsError(ValueError):
    """An input the agent cannot start with: the message says which and why."""


@dataclass(frozen=True, slots=True)
class Flags:
    """The ``proxy`` command's flags, under pilot-agent's names (see ``command.py``)."""

    node_type: str = "sidecar"
    domain: str = ""
    mesh_config: str = "./etc/istio/config/mesh"
    service_cluster: str = "istio-proxy"
    proxy_log_level: str = "warning"
    proxy_component_log_level: str = ""
    concurrency: int = 0
    template_file: str = ""
    log_output_level: str = "default:info"


@dataclass(frozen=True, slots=True)
class AgentSettings:
    """Everything the agent runs with; built by :func:`load_settings`, never changed after."""

    root: Path
    flags: Flags
    proxy_config: Mapping[str, Any]
    pod_name: str
    pod_namespace: str
    service_account: str
    ip_addresses: tuple[str, ...]
    dns_domain: str
    ca_address: str
    istiod_san: str
    xds_root_ca: str
    delta_xds: bool
    envoy_status_port: int
    envoy_prometheus_port: int
    skip_deprecated_logs: bool
    app_probers: Mapping[str, Any]
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    environ: Mapping[str, str] = field(repr=False)

    @property
    def node_id(self) -> str:
        """``TYPE~IP~POD.NS~DOMAIN``, as istiod parses it."""
        ip = self.ip_addresses[0] if self.ip_addresses else ""
        return f"{self.flags.node_type}~{ip}~{self.pod_name}.{self.pod_namespace}~{self.dns_domain}"

    @property
    def config_path(self) -> Path:
        """Where the bootstrap and the XDS socket go, relative to the working directory as in the pod."""
        return Path(str(self.proxy_config["configPath"]))

    @property
    def binary_path(self) -> str:
        return str(self.proxy_config["binaryPath"])

    @property
    def admin_port(self) -> int:
        return int(self.proxy_config.get("proxyAdminPort", 0))

    @property
    def status_port(self) -> int:
        return int(self.proxy_config.get("statusPort", 0))

    @property
    def discovery_address(self) -> str:
        return str(self.proxy_config.get("discoveryAddress", ""))

    @property
    def mutual_tls(self) -> bool:
        """controlPlaneAuthPolicy MUTUAL_TLS (the default): TLS to istiod for xDS and the CA."""
        return bool(self.proxy_config.get("controlPlaneAuthPolicy", "NONE") == "MUTUAL_TLS")

    @property
    def drain_duration(self) -> float:
        return parse_duration(self.proxy_config.get("drainDuration", "45s"))

    @property
    def termination_drain_duration(self) -> float:
        return parse_duration(self.proxy_config.get("terminationDrainDuration", "5s"))

    @property
    def concurrency(self) -> int:
        return int(self.proxy_config.get("concurrency", 0) or 0)

    @property
    def pilot_san(self) -> str:
        """The name istiod's certificate must carry: ISTIOD_SAN, else the discoveryAddress host."""
        if self.istiod_san:
            return self.istiod_san
        host = self.discovery_address.rsplit(":", 1)[0].strip("[]")
        return "istiod.istio-system.svc" if host == "localhost" else host

    @property
    def cluster_id(self) -> str:
        return self.environ.get("ISTIO_META_CLUSTER_ID") or "Kubernetes"

    def path(self, relative: Path | str) -> Path:
        """A pod path (``./etc/...``) on this machine: under the working directory."""
        p = Path(relative)
        return p if p.is_absolute() else self.root / p


def parse_duration(value: Any) -> float:
    """A ProxyConfig duration (``"45s"``, ``"1.5s"``, Go's ``"1m30s"``, or seconds as a number)."""
    if isinstance(value, int | float):
        return float(value)
    text = str(value).strip()
    parts = re.findall(r"([0-9]*\.?[0-9]+)(ms|h|m|s)", text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise SettingsError(f"not a duration: {value!r}")
    scale = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
    return sum(float(n) * scale[u] for n, u in parts)


def parse_downward_api(text: str) -> dict[str, str]:
    """The podinfo files: one ``key="Go-quoted value"`` a line (``ParseDownwardAPI``)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, quoted = line.partition("=")
        if not sep:
            continue
        try:
            value = json.loads(quoted)
        except json.JSONDecodeError as err:
            raise SettingsError(f"cannot unquote {quoted!r}: {err}") from None
        if not isinstance(value, str):
            raise SettingsError(f"cannot unquote {quoted!r}: not a string")
        out[key] = value
    return out


def merge_proxy_config(
    base: Mapping[str, Any], overlay: Mapping[str, Any], oneof: frozenset[str] = frozenset()
) -> dict[str, Any]:
    """One layer over another: messages merge field by field, everything else is replaced. A member of
    a oneof (``oneof``: the members among this message's fields) set by the overlay clears the others,
    as decoding into the proto does: a pod's datadog tracer replaces the mesh's zipkin one."""
    out = dict(base)
    for key, value in overlay.items():
        if key in oneof:
            for other in oneof - {key}:
                out.pop(other, None)
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merge_proxy_config(out[key], value, ONEOFS.get(key, frozenset()))
        else:
            out[key] = value
    return out


def proxy_tracing(config: Mapping[str, Any]) -> proxy_pb2.Tracing | None:
    """The ProxyConfig's ``tracing``, checked as pilot-agent checks it when it starts (collector
    addresses, TLS settings); None when there is none."""
    value = config.get("tracing")
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise SettingsError("ProxyConfig tracing: not a mapping")
    try:
        tracing = json_format.ParseDict(dict(value), proxy_pb2.Tracing())
    except json_format.ParseError as err:
        raise SettingsError(f"ProxyConfig tracing: {err}") from None
    errors = tracing_errors(tracing)
    if errors:
        raise SettingsError("ProxyConfig " + "; ".join(errors))
    return tracing


def _layer(text: str, what: str) -> dict[str, Any]:
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise SettingsError(f"cannot parse the proxy config from {what}: {err}") from None
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise SettingsError(f"the proxy config from {what} is not a mapping")
    return value


def _read_podinfo(path: Path) -> dict[str, str]:
    try:
        return parse_downward_api(path.read_text())
    except FileNotFoundError:
        return {}
    except OSError as err:
        raise SettingsError(f"cannot read {path}: {err}") from None


def build_proxy_config(
    root: Path, flags: Flags, environ: Mapping[str, str], annotations: Mapping[str, str]
) -> dict[str, Any]:
    """The effective ProxyConfig (``config.ConstructProxyConfig``)."""
    config = dict(DEFAULT_PROXY_CONFIG)
    mesh_path = Path(flags.mesh_config)
    mesh_path = mesh_path if mesh_path.is_absolute() else root / mesh_path
    if mesh_path.is_file():
        try:
            mesh = _layer(mesh_path.read_text(), str(mesh_path))
        except OSError as err:
            raise SettingsError(f"cannot read the mesh config {mesh_path}: {err}") from None
        default_config = mesh.get("defaultConfig") or {}
        if not isinstance(default_config, dict):
            raise SettingsError(f"{mesh_path}: defaultConfig is not a mapping")
        config = merge_proxy_config(config, default_config)
    if environ.get("PROXY_CONFIG"):
        config = merge_proxy_config(config, _layer(environ["PROXY_CONFIG"], "PROXY_CONFIG"))
    if annotations.get(PROXY_CONFIG_ANNOTATION):
        config = merge_proxy_config(
            config, _layer(annotations[PROXY_CONFIG_ANNOTATION], f"the {PROXY_CONFIG_ANNOTATION} annotation")
        )
    if "concurrency" not in config:
        cpu_limit = _int(environ, "ISTIO_CPU_LIMIT", 0)
        if cpu_limit:
            config["concurrency"] = cpu_limit
    if flags.concurrency:
        config["concurrency"] = flags.concurrency
    if not config.get("serviceCluster") and "tracingServiceName" not in config:
        config["serviceCluster"] = flags.service_cluster
    if DISCOVERY_ADDRESS_ANNOTATION in annotations:
        config["discoveryAddress"] = annotations[DISCOVERY_ADDRESS_ANNOTATION]
    if STATUS_PORT_ANNOTATION in annotations:
        try:
            config["statusPort"] = int(annotations[STATUS_PORT_ANNOTATION])
        except ValueError:
            raise SettingsError(f"{STATUS_PORT_ANNOTATION}: not a port") from None
    for key in ("drainDuration", "terminationDrainDuration"):
        parse_duration(config.get(key, "0s"))
    for key in ("proxyAdminPort", "statusPort"):
        if not isinstance(config.get(key, 0), int):
            raise SettingsError(f"ProxyConfig {key}: not a port: {config.get(key)!r}")
    if config.get("controlPlaneAuthPolicy", "NONE") not in ("NONE", "MUTUAL_TLS"):
        raise SettingsError(f"controlPlaneAuthPolicy {config['controlPlaneAuthPolicy']!r} is not supported")
    proxy_tracing(config)
    return config


def _int(environ: Mapping[str, str], name: str, default: int) -> int:
    text = environ.get(name, "")
    if not text:
        return default
    try:
        return math.ceil(float(text))
    except ValueError:
        raise SettingsError(f"{name}={text!r} is not a number") from None


def _bool(environ: Mapping[str, str], name: str, default: bool) -> bool:
    text = environ.get(name, "").strip().lower()
    if not text:
        return default
    if text in ("1", "t", "true"):
        return True
    if text in ("0", "f", "false"):
        return False
    raise SettingsError(f"{name}={text!r} is not a boolean")


def load_settings(flags: Flags, environ: Mapping[str, str], root: Path) -> AgentSettings:
    """Read flags, environment and podinfo files once; raise :class:`SettingsError` on a bad input."""
    if flags.node_type not in NODE_TYPES:
        raise SettingsError(f"invalid proxy type {flags.node_type!r} (one of {', '.join(NODE_TYPES)})")
    annotations = _read_podinfo(root / PODINFO_ANNOTATIONS)
    labels = _read_podinfo(root / PODINFO_LABELS)
    proxy_config = build_proxy_config(root, flags, environ, annotations)
    namespace = environ.get("POD_NAMESPACE", "")
    ips: list[str] = []
    instance_ip = environ.get("INSTANCE_IP", "")
    if instance_ip:
        try:
            ips.append(str(ipaddress.ip_address(instance_ip)))
        except ValueError:
            raise SettingsError(f"INSTANCE_IP={instance_ip!r} is not an IP address") from None
    probers_text = environ.get("ISTIO_KUBE_APP_PROBERS", "")
    try:
        probers = json.loads(probers_text) if probers_text else {}
    except json.JSONDecodeError as err:
        raise SettingsError(f"ISTIO_KUBE_APP_PROBERS is not JSON: {err}") from None
    if not isinstance(probers, dict):
        raise SettingsError("ISTIO_KUBE_APP_PROBERS is not a JSON object")
    return AgentSettings(
        root=root,
        flags=flags,
        proxy_config=proxy_config,
        pod_name=environ.get("POD_NAME", ""),
        pod_namespace=namespace,
        service_account=environ.get("SERVICE_ACCOUNT", ""),
        # In a pod the pod IP is the only private address; outside one, the host's other addresses
        # (which pilot-agent appends) are not enumerated.
        ip_addresses=tuple(ips) or ("127.0.0.1", "::1"),
        dns_domain=flags.domain or f"{namespace}.svc.cluster.local",
        ca_address=environ.get("CA_ADDR", "") or str(proxy_config["discoveryAddress"]),
        istiod_san=environ.get("ISTIOD_SAN", ""),
        xds_root_ca=environ.get("XDS_ROOT_CA", ""),
        delta_xds=_bool(environ, "ISTIO_DELTA_XDS", True),
        envoy_status_port=_int(environ, "ENVOY_STATUS_PORT", 15021),
        envoy_prometheus_port=_int(environ, "ENVOY_PROMETHEUS_PORT", 15090),
        skip_deprecated_logs=_bool(environ, "ENVOY_SKIP_DEPRECATED_LOGS", True),
        app_probers=probers,
        labels=labels,
        annotations=annotations,
        environ=dict(environ),
    )


#: BootstrapNodeMetadata's string fields (``omitempty``): an empty value is left out.
TYPED_STRINGS = frozenset(
    {
        "NAME", "OWNER", "APP_CONTAINERS", "ISTIO_PROXY_SHA", "ISTIO_VERSION", "ISTIO_REVISION", "NAMESPACE",
        "NODE_NAME", "WORKLOAD_NAME", "INTERCEPTION_MODE", "SERVICE_ACCOUNT", "HTTP_PROXY_PORT", "MESH_ID",
        "CLUSTER_ID", "NETWORK", "GENERATOR", "DNS_PROXY_ADDR", "AUTO_REGISTER_GROUP", "WORKLOAD_ENTRY",
        "UNPRIVILEGED_POD", "STS_PORT", "CLOUDRUN_ADDR", "IDLE_TIMEOUT", "HTTP10", "OUTLIER_LOG_PATH",
    }
)  # fmt: skip
#: BootstrapNodeMetadata's ``StringBool`` fields: ``"true"`` when set, left out when false.
STRING_BOOLS = frozenset(
    {
        "ENABLE_SELF_DISCOVERY", "DNS_CAPTURE", "DNS_AUTO_ALLOCATE", "ENABLE_HBONE", "DISABLE_HBONE_SEND",
        "EXIT_ON_ZERO_ACTIVE_CONNECTIONS", "INBOUND_LISTENER_EXACT_BALANCE",
        "OUTBOUND_LISTENER_EXACT_BALANCE",
    }
)  # fmt: skip
META_PREFIX = "ISTIO_META_"
METAJSON_PREFIX = "ISTIO_METAJSON_"


def _truthy(value: Any) -> bool:
    return str(value).strip().lower() in ("1", "t", "true")


def proxy_config_json(config: Mapping[str, Any]) -> dict[str, Any]:
    """The ProxyConfig as protojson writes it: zero values of plain fields left out (so
    ``controlPlaneAuthPolicy: NONE``, the enum's zero, does not appear)."""
    return {
        k: v
        for k, v in config.items()
        if k in WRAPPER_FIELDS or v not in (None, "", 0, False, "NONE", [], {})
    }


def _pod_ports(value: Any) -> str:
    """POD_PORTS as pilot-agent re-encodes it: compact, each port ``{name?, containerPort, protocol}``."""
    ports = json.loads(value) if isinstance(value, str) else value
    out = []
    for port in ports or []:
        item: dict[str, Any] = {}
        if port.get("name"):
            item["name"] = port["name"]
        item["containerPort"] = int(port.get("containerPort", 0))
        item["protocol"] = str(port.get("protocol", ""))
        out.append(item)
    return json.dumps(out, separators=(",", ":"))


def _locality_label(labels: Mapping[str, str]) -> str:
    label = next((labels[k] for k in LOCALITY_LABELS if k in labels), "")
    return label if "/" in label else label.replace(".", "/")


def node_metadata(settings: AgentSettings) -> dict[str, Any]:
    """``node.metadata`` as pilot-agent sends it (``bootstrap.GetNodeMetaData`` then its typed encoding):
    ``proxyMetadata`` ``ISTIO_META_*`` entries, then ``ISTIO_META_*`` and ``ISTIO_METAJSON_*`` variables,
    then the fields the agent fills in itself, which win over the variables."""
    env = settings.environ
    raw: dict[str, Any] = {}
    proxy_metadata = settings.proxy_config.get("proxyMetadata") or {}
    for key, value in proxy_metadata.items():
        if key.startswith(META_PREFIX):
            raw[key[len(META_PREFIX) :]] = value
    for key in sorted(env):
        if key.startswith(META_PREFIX):
            raw[key[len(META_PREFIX) :]] = env[key]
    static_labels: dict[str, str] = {}
    for key in sorted(env):
        if key.startswith(METAJSON_PREFIX):
            try:
                value = json.loads(env[key])
            except json.JSONDecodeError as err:
                raise SettingsError(f"{key} is not JSON: {err}") from None
            if isinstance(value, dict):
                raw.update(value)
                if key == METAJSON_PREFIX + "LABELS":
                    static_labels = {str(k): str(v) for k, v in value.items()}
    if env.get("DNS_PROXY_ADDR"):
        raw["DNS_PROXY_ADDR"] = env["DNS_PROXY_ADDR"]

    meta = dict(raw)
    for key in TYPED_STRINGS & meta.keys():
        if meta[key] in ("", None):
            del meta[key]
    for key in STRING_BOOLS & meta.keys():
        if _truthy(meta[key]):
            meta[key] = "true"
        else:
            del meta[key]
    if "POD_PORTS" in meta:
        try:
            meta["POD_PORTS"] = _pod_ports(meta["POD_PORTS"])
        except (ValueError, TypeError, AttributeError) as err:
            raise SettingsError(f"POD_PORTS is not a list of ports: {err}") from None
    meta.setdefault("ISTIO_VERSION", ISTIO_VERSION)
    meta["INSTANCE_IPS"] = ",".join(dict.fromkeys(settings.ip_addresses))
    for key, port in (
        ("ENVOY_STATUS_PORT", settings.envoy_status_port),
        ("ENVOY_PROMETHEUS_PORT", settings.envoy_prometheus_port),
    ):
        meta.pop(key, None)
        if port:
            meta[key] = port
    if settings.skip_deprecated_logs:
        meta["ENVOY_SKIP_DEPRECATED_LOGS"] = "true"
    else:
        meta.pop("ENVOY_SKIP_DEPRECATED_LOGS", None)
    if "PEER_METADATA_DISCOVERY" in env:
        discovery = _bool(env, "PEER_METADATA_DISCOVERY", False)
    else:
        discovery = _truthy(meta.get("ENABLE_HBONE", "false"))
    meta["METADATA_DISCOVERY"] = "true" if discovery else "false"
    meta["WORKLOAD_IDENTITY_SOCKET_FILE"] = env.get("WORKLOAD_IDENTITY_SOCKET_FILE") or "socket"
    meta["PROXY_CONFIG"] = proxy_config_json(settings.proxy_config)
    for key, value in (
        ("NAME", settings.pod_name),
        ("NAMESPACE", settings.pod_namespace),
        ("SERVICE_ACCOUNT", settings.service_account),
    ):
        if value:
            meta[key] = value
    if static_labels:
        meta["STATIC_LABELS"] = static_labels
    labels = dict(static_labels)
    if (settings.root / PODINFO_LABELS).is_file():
        labels.update({k: v for k, v in settings.labels.items() if k != POD_TEMPLATE_HASH})
    locality = _locality_label(labels)
    if locality:
        labels["istio-locality"] = locality
    if labels:
        meta["LABELS"] = labels
    else:
        meta.pop("LABELS", None)
    if settings.annotations or (settings.root / PODINFO_ANNOTATIONS).is_file():
        meta["ANNOTATIONS"] = dict(settings.annotations)
    if settings.mutual_tls:
        meta["PILOT_SAN"] = [settings.pilot_san]
    else:
        meta.pop("PILOT_SAN", None)
    return meta


def node_locality(metadata: Mapping[str, Any]) -> dict[str, str]:
    """``node.locality`` from the locality label (``region/zone/subzone``); empty without one."""
    parts = _locality_label(metadata.get("LABELS") or {}).split("/")
    return {k: v for k, v in zip(("region", "zone", "sub_zone"), parts, strict=False) if v}


def service_cluster(settings: AgentSettings, metadata: Mapping[str, Any]) -> str:
    """``node.cluster`` (``getServiceCluster``): the app label and namespace unless one is configured."""
    labels: Mapping[str, str] = metadata.get("LABELS") or {}
    namespace = settings.pod_namespace
    workload = str(metadata.get("WORKLOAD_NAME") or "istio-proxy")

    def or_default(name: str) -> str:
        if name and name != "istio-proxy":
            return name
        app = next((labels[k] for k in APP_LABELS if labels.get(k)), "")
        if app:
            return f"{app}.{namespace}"
        if metadata.get("WORKLOAD_NAME"):
            return f"{workload}.{namespace}"
        return f"istio-proxy.{namespace}" if namespace else "istio-proxy"

    tracing = settings.proxy_config.get("tracingServiceName")
    if tracing is None or "serviceCluster" in settings.proxy_config:
        return or_default(str(settings.proxy_config.get("serviceCluster", "istio-proxy")))
    canonical = next((labels[k] for k in CANONICAL_NAME_LABELS if labels.get(k)), workload)
    if tracing == "CANONICAL_NAME_ONLY":
        return or_default(canonical)
    if tracing == "CANONICAL_NAME_AND_NAMESPACE":
        return f"{canonical}.{namespace}" if namespace else or_default(canonical)
    return or_default("istio-proxy")
