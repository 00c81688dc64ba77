"""istiod's command line and environment, as Istio's ``istio-discovery`` chart passes them: one table.

Istio's chart runs ``pilot-discovery discovery`` with istiod's flags (``--monitoringAddr=:15014``,
``--keepaliveMaxServerConnectionAge 30m``, ...) and environment (``REVISION``, ``PILOT_CERT_PROVIDER``,
``GOMAXPROCS``, ...). meshpilot takes that command line unchanged. Each name istiod knows is here once,
with whether meshpilot implements it:

- ``IMPLEMENTED``: meshpilot honours it (a flag of ``meshpilot discovery`` under istiod's name, or an
  environment variable the server reads);
- ``NOT_IMPLEMENTED``: accepted, and logged once at start, by name, when set to anything but the
  ``inert`` values (those that mean what meshpilot does anyway);
- ``REFUSED``: a security setting meshpilot cannot honour; set to anything but an inert value, the
  server does not start (it must not run weaker than asked).

istiod's flags that ``meshpilot discovery`` does not define itself are added to its parser by
:func:`add_istiod_flags` (both ``--x=y`` and ``--x y`` work, as for istiod); :func:`startup_report`
reads the parsed flags and the environment against the table and says what is not implemented. Other
``PILOT_*``/``ISTIO_*`` variables, which istiod reads as feature switches, are logged as unknown.
"""

from __future__ import annotations

import argparse
import enum
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from meshpilot.server.settings import duration_seconds

log = logging.getLogger(__name__)

__all__ = [
    "ENV",
    "FLAGS",
    "Knob",
    "Report",
    "Support",
    "add_istiod_flags",
    "log_report",
    "startup_report",
]


class Support(enum.Enum):
    IMPLEMENTED = "implemented"
    NOT_IMPLEMENTED = "not implemented"
    REFUSED = "refused"


def _absent_file(value: str) -> bool:
    return not value or not os.path.exists(value)


def _lasting(seconds: float) -> Callable[[str], bool]:
    """Inert when the duration is ``seconds``, however it is spelt (``30m``, ``1800s``)."""

    def same(value: str) -> bool:
        try:
            return duration_seconds(value) == seconds
        except ValueError:
            return False

    return same


@dataclass(frozen=True, slots=True)
class Knob:
    """One flag (without its dashes) or environment variable of istiod."""

    name: str
    support: Support
    note: str = ""
    #: Values that mean what meshpilot does anyway: set to one of them, nothing is logged.
    inert: tuple[str, ...] = ()
    #: For a value that has no fixed inert spelling (a path that is not there).
    inert_when: Callable[[str], bool] | None = None
    #: Flags: "bool" (no value needed), "duration", "int", "float" or "string".
    kind: str = "string"
    #: Flags: a one-letter alias (``-n``).
    short: str = ""

    def is_inert(self, value: str) -> bool:
        if value in self.inert:
            return True
        return self.inert_when is not None and self.inert_when(value)


_I, _N, _R = Support.IMPLEMENTED, Support.NOT_IMPLEMENTED, Support.REFUSED
_LOGGING = "meshpilot's logging options"

#: The flags of the pinned istiod's ``pilot-discovery discovery`` (its ``--help``; the log flags come from
#: istio's log package).
FLAGS: tuple[Knob, ...] = (
    Knob("caCertFile", _N, "the webhook's serving chain comes from --tlsCertFile alone"),
    Knob("clusterAliases", _N, "cluster ID aliases", inert=("",)),
    Knob("clusterID", _I),
    Knob("clusterRegistriesNamespace", _N, "multicluster Secrets are read from the Istio namespace"),
    Knob("cniNamespace", _N, "no CNI node-untaint controller"),
    Knob("configDir", _I),
    Knob("ctrlz_address", _N, "no ControlZ introspection page"),
    Knob("ctrlz_port", _N, "no ControlZ introspection page", kind="int"),
    Knob("domain", _I),
    Knob("grpcAddr", _I),
    Knob("httpAddr", _I),
    Knob("httpsAddr", _I),
    # meshpilot's gRPC servers ping after 30 s and close connections after 30 minutes (server.app's
    # GRPC_OPTIONS): the chart's values; others are not applied.
    Knob("keepaliveInterval", _N, "pings after 30s", inert_when=_lasting(30), kind="duration"),
    Knob(
        "keepaliveMaxServerConnectionAge",
        _N,
        "connections are closed after 30m",
        inert_when=_lasting(30 * 60),
        kind="duration",
    ),
    Knob("keepaliveTimeout", _N, "gRPC's keepalive defaults apply", kind="duration"),
    Knob("kubeconfig", _I),
    Knob("kubernetesApiBurst", _N, "API requests are not rate limited on the client", kind="int"),
    Knob("kubernetesApiQPS", _N, "API requests are not rate limited on the client", kind="float"),
    Knob("log_as_json", _I, _LOGGING, kind="bool"),
    Knob("log_caller", _I, _LOGGING),
    Knob("log_output_level", _I, _LOGGING),
    Knob("log_stacktrace_level", _I, _LOGGING),
    Knob("log_target", _I, _LOGGING),
    Knob("meshConfig", _I),
    Knob("monitoringAddr", _I),
    Knob("namespace", _I, short="n"),
    Knob("networksConfig", _N, "no MeshNetworks (split-horizon EDS across networks)"),
    Knob("profile", _N, "no /debug/pprof", inert=("false",), kind="bool"),
    Knob("registries", _N, "the Kubernetes registry only", inert=("Kubernetes",)),
    Knob("secureGRPCAddr", _I),
    Knob("shutdownDuration", _N, "open streams get a fixed grace period", kind="duration"),
    Knob("tls-cipher-suites", _N, "the TLS library's cipher suites"),
    Knob("tls-min-version", _N, "TLS 1.2 and newer", inert=("1.2", "")),
    Knob("tlsCertFile", _I),
    Knob("tlsKeyFile", _I),
    Knob("vklog", _N, "no klog verbosity", kind="int"),
)

#: What the chart sets (``templates/deployment.yaml``, and the ``.Values.env`` names its templates read),
#: and every variable meshpilot's server reads.
ENV: tuple[Knob, ...] = (
    # Set by the chart.
    Knob("REVISION", _N, "one control plane: the `default` revision", inert=("default", "")),
    Knob("PILOT_CERT_PROVIDER", _N, "the webhook's certificate comes from meshpilot's CA", inert=("istiod",)),
    Knob("POD_NAME", _I),
    Knob("POD_NAMESPACE", _I),
    Knob("SERVICE_ACCOUNT", _N, "not needed by meshpilot", inert_when=lambda _: True),
    Knob(
        "KUBECONFIG",
        _N,
        "in a pod the in-cluster credentials are used (an external control plane's kubeconfig is not)",
        inert_when=_absent_file,
    ),
    Knob("CA_TRUSTED_NODE_ACCOUNTS", _N, "no node agents (ztunnel) may ask for other identities"),
    Knob("PILOT_TRACE_SAMPLING", _I),
    Knob("PILOT_ENABLE_NODE_UNTAINT_CONTROLLERS", _N, "no CNI node-untaint controller", inert=("false",)),
    Knob("PILOT_NODE_UNTAINT_CONTROLLERS_TAINT_NAME", _N, "no CNI node-untaint controller"),
    Knob("EXTERNAL_ISTIOD", _N, "no external control plane", inert=("false",)),
    Knob("PILOT_CA_CERT_CONFIGMAP", _N, "the root is published as istio-ca-root-cert"),
    Knob("PILOT_CRL_CONFIGMAP", _N, "no certificate revocation list"),
    Knob("PILOT_ENABLE_ANALYSIS", _N, "no config analysis", inert=("false",)),
    Knob("CLUSTER_ID", _I),
    Knob("GOMAXPROCS", _I, "bounds the push workers --push-workers 0 starts (pool.sizing)"),
    Knob("PLATFORM", _N, "no platform-specific metadata", inert=("",)),
    Knob("GODEBUG", _N, "a Go runtime setting", inert=("",)),
    Knob("COMPLIANCE_POLICY", _R, "meshpilot's TLS is not restricted to a compliance policy", inert=("",)),
    Knob("EXTERNAL_CA", _N, "meshpilot's own CA signs", inert=("",)),
    Knob("MCS_API_GROUP", _N, "no Kubernetes multi-cluster services"),
    Knob("PILOT_ENABLE_GATEWAY_API_DEPLOYMENT_CONTROLLER", _N, "no Gateway API", inert=("false",)),
    Knob("ENABLE_CLUSTER_TRUST_BUNDLE_API", _N, "no ClusterTrustBundles", inert=("false",)),
    # Read by meshpilot's server.
    Knob("PILOT_DEBOUNCE_AFTER", _I),
    Knob("PILOT_DEBOUNCE_MAX", _I),
    Knob("PILOT_PUSH_THROTTLE", _I),
    Knob("PILOT_XDS_CACHE_SIZE", _I),
    Knob("PILOT_ENABLE_XDS_CACHE", _I),
    Knob("PILOT_MAX_REQUESTS_PER_SECOND", _I),
    Knob("PILOT_REMOTE_CLUSTER_TIMEOUT", _I),
    Knob("PILOT_ENABLE_STATUS", _I),
    Knob("PILOT_ENABLE_IP_AUTOALLOCATE", _I),
    Knob("UNSAFE_PILOT_ENABLE_RUNTIME_ASSERTIONS", _I),
    Knob("ENABLE_DEBUG_ENDPOINT_AUTH", _I),
    Knob("ENABLE_DEBUG_ON_HTTP", _I),
    Knob("DEBUG_ENDPOINT_AUTH_ALLOWED_NAMESPACES", _I),
    Knob("ROOT_CA_DIR", _I),
)

#: Prefixes of istiod's feature variables: one of these not in ENV is logged as unknown.
FEATURE_PREFIXES = ("PILOT_", "ISTIO_", "UNSAFE_PILOT_")

#: Where the parsed values of istiod's flags that meshpilot does not implement are kept.
_DEST = "istiod_flags"


class _Record(argparse.Action):
    """Keeps ``{flag name: value}`` of a flag meshpilot accepts without implementing it."""

    def __init__(self, *args: object, knob: Knob, **kwargs: object) -> None:
        self.knob = knob
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        value = "true" if values is None else str(values)
        _check(self.knob, value, parser)
        recorded = dict(getattr(namespace, _DEST, None) or {})
        recorded[self.knob.name] = value
        setattr(namespace, _DEST, recorded)


def _check(knob: Knob, value: str, parser: argparse.ArgumentParser) -> None:
    """A value istiod would refuse is refused here too (istiod exits on a bad duration)."""
    try:
        if knob.kind == "duration":
            duration_seconds(value)
        elif knob.kind == "int":
            int(value)
        elif knob.kind == "float":
            float(value)
        elif knob.kind == "bool" and value.lower() not in ("true", "false", "1", "0", "t", "f"):
            raise ValueError("not a boolean")
    except ValueError as err:
        parser.error(f"--{knob.name}={value}: {err}")


def add_istiod_flags(parser: argparse.ArgumentParser) -> None:
    """Add to ``meshpilot discovery``'s parser each flag of istiod it does not define itself.

    A flag the table marks implemented but the parser lacks (not wired yet) is accepted and reported as
    not implemented, never refused.
    """
    parser.set_defaults(**{_DEST: {}})
    known = parser._option_string_actions
    for knob in FLAGS:
        names = [f"--{knob.name}", *([f"-{knob.short}"] if knob.short else [])]
        if any(name in known for name in names):
            continue
        nargs = "?" if knob.kind == "bool" else None
        parser.add_argument(
            *(n for n in names if n not in known),
            action=_Record,
            knob=knob,
            nargs=nargs,
            metavar="VALUE",
            help=argparse.SUPPRESS,
        )


@dataclass(frozen=True, slots=True)
class Report:
    """What :func:`startup_report` found: (name, value, why) of each, in the table's order."""

    not_implemented: tuple[tuple[str, str, str], ...]
    refused: tuple[tuple[str, str, str], ...]
    unknown: tuple[tuple[str, str], ...]

    @property
    def unimplemented_names(self) -> tuple[str, ...]:
        """Every name set here that has no effect (not implemented, or not known), as the
        ``meshpilot_unimplemented_settings`` gauge labels them."""
        return tuple(n for n, *_ in self.not_implemented) + tuple(n for n, _ in self.unknown)


def _why(flag: Knob) -> str:
    if flag.support is Support.IMPLEMENTED:
        return "istiod's flag is known, but not wired to meshpilot's options in this build"
    return flag.note


def startup_report(args: argparse.Namespace, environ: Mapping[str, str]) -> Report:
    """istiod's flags and variables set here that meshpilot does not implement, or refuses."""
    flags: dict[str, str] = getattr(args, _DEST, None) or {}
    by_name = {k.name: k for k in FLAGS}
    not_implemented = [
        (f"--{name}", value, _why(by_name[name]))
        for name, value in flags.items()
        if not by_name[name].is_inert(value)
    ]
    refused: list[tuple[str, str, str]] = []
    for knob in ENV:
        value = environ.get(knob.name)
        if value is None or knob.support is Support.IMPLEMENTED or knob.is_inert(value):
            continue
        (refused if knob.support is Support.REFUSED else not_implemented).append(
            (knob.name, value, knob.note)
        )
    listed = {k.name for k in ENV}
    unknown = sorted(
        (name, value)
        for name, value in environ.items()
        if name.startswith(FEATURE_PREFIXES) and name not in listed
    )
    return Report(tuple(not_implemented), tuple(refused), tuple(unknown))


def log_report(report: Report) -> None:
    """One line per name; the caller refuses to start when ``report.refused`` is not empty."""
    for name, value, why in report.not_implemented:
        log.warning("istiod setting %s=%s accepted but not implemented: %s", name, value, why)
    for name, value in report.unknown:
        log.warning("istiod setting %s=%s not known to meshpilot: not implemented", name, value)
    for name, value, why in report.refused:
        log.error("istiod setting %s=%s is refused: %s", name, value, why)
