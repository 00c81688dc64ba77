"""Settings of the discovery server: parsed once from flags and environment, then passed around."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from meshpilot.ca.mesh_ca import CaSettings
from meshpilot.config.protojson import parse_go_duration


@dataclass(frozen=True, slots=True)
class Address:
    """A listen address; an empty host means every interface."""

    host: str
    port: int

    @classmethod
    def parse(cls, text: str) -> Address:
        host, sep, port = text.rpartition(":")
        if not sep or not port.isdigit():
            raise ValueError(f"invalid address {text!r}: expected HOST:PORT or :PORT")
        number = int(port)
        if not 0 <= number < 65536:
            raise ValueError(f"invalid port in address {text!r}")
        return cls(host.strip("[]"), number)

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    @property
    def grpc_target(self) -> str:
        """The form grpc's add_insecure_port wants; all interfaces is ``[::]``."""
        return str(self) if self.host else f"[::]:{self.port}"


def duration_seconds(text: str) -> float:
    """Seconds in a Go duration ("100ms", "10s") as istiod's env knobs take them."""
    try:
        return float(parse_go_duration(text))
    except ValueError:
        raise ValueError(f"invalid duration {text!r}") from None


@dataclass(frozen=True, slots=True)
class DiscoverySettings:
    #: Directory of YAML/JSON config (Kubernetes objects and Istio config).
    config_dir: Path | None = None
    #: MeshConfig YAML; istiod's defaults when None.
    mesh_config: Path | None = None
    grpc_addr: Address = Address("", 15010)
    #: TLS port of ADS and the CA (istiod's 15012); None turns it off.
    secure_grpc_addr: Address | None = Address("", 15012)
    #: A second TLS port of ADS and the CA that requires a client certificate of the mesh; None: off.
    secure_grpc_client_cert_addr: Address | None = None
    #: Where the CA's key comes from.
    ca: CaSettings = field(default_factory=CaSettings)
    http_addr: Address = Address("", 8080)
    #: ENABLE_DEBUG_ON_HTTP: /debug also on the HTTP port (istiod's default). Either port answers
    #: loopback callers, and others only with a token the xDS authenticators accept
    #: (``server.debug_access``).
    debug_on_http: bool = True
    monitoring_addr: Address = Address("", 15014)
    #: HTTPS address of the admission webhooks; None turns them off.
    webhook_addr: Address | None = Address("", 15017)
    #: Serving certificate and key of the webhooks; a self-signed pair is made when unset.
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    #: The injector's ``config`` and ``values`` files (istio-sidecar-injector); built-in when None.
    inject_config: Path | None = None
    #: Kubernetes API access: a kubeconfig file, or in-cluster credentials when None.
    kubeconfig: Path | None = None
    #: Whether to read from the Kubernetes API at all.
    use_kube: bool = False
    istio_namespace: str = "istio-system"
    #: The status-writer leader writes status.observedGeneration (PILOT_ENABLE_STATUS).
    enable_status: bool = False
    lease_duration: float = 30.0
    #: PILOT_REMOTE_CLUSTER_TIMEOUT: how long readiness waits for remote clusters.
    remote_cluster_timeout: float = 30.0
    domain: str = "cluster.local"
    cluster_id: str = "Kubernetes"
    #: Quiet period and maximum delay of debounce (PILOT_DEBOUNCE_AFTER / _MAX).
    debounce_after: float = 0.1
    debounce_max: float = 10.0
    #: Concurrent pushes (PILOT_PUSH_THROTTLE); 0 is automatic (``xds.server.default_push_throttle``).
    push_throttle: int = 0
    #: XdsCache entries per type (PILOT_XDS_CACHE_SIZE); 0 disables it (PILOT_ENABLE_XDS_CACHE=false).
    xds_cache_size: int = 60000
    #: New streams per second (PILOT_MAX_REQUESTS_PER_SECOND); 0 is istiod's automatic value.
    max_requests_per_second: float = 0.0
    #: ENABLE_DEBUG_ENDPOINT_AUTH: debug data, over xDS and HTTP, only for verified identities, outside
    #: the system namespace only per-proxy pages about their own namespace (``xds.debug_access``).
    debug_endpoint_auth: bool = True
    #: DEBUG_ENDPOINT_AUTH_ALLOWED_NAMESPACES: namespaces that may read debug data like the system one.
    debug_auth_allowed_namespaces: frozenset[str] = frozenset()
    #: POD_NAME: this instance's name in sync status responses (what ``istioctl version`` shows).
    pod_name: str = ""
    #: Processes serving xDS (``--push-workers``); 1 serves everything from this one process, 0 is
    #: one per usable core (``pool.sizing``; the command's default). An embedded server (tests,
    #: tools) is one process unless it asks.
    push_workers: int = 1
    #: Grace period for open streams on shutdown, in seconds.
    shutdown_grace: float = 2.0
    log_level: str = "info"
    #: istiod's flags and variables set for this server that it accepts without implementing them
    #: (``cli.istiod_compat``): logged at start, and shown by name in ``meshpilot_unimplemented_settings``.
    unimplemented_settings: tuple[str, ...] = ()


def env_default(name: str, default: str) -> str:
    return os.environ.get(name, "") or default
