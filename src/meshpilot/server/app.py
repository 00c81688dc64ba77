"""The composition root: builds the discovery server from settings (``server.run`` starts and
stops it). It only wires; behaviour lives in the components."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections import Counter
from collections.abc import Callable
from typing import Any

import grpc
from aiohttp.typedefs import Middleware
from prometheus_client import Counter as Counter_

from meshpilot.config.errors import ConfigError
from meshpilot.config.file_source import FileSource, ObjectSink
from meshpilot.config.store import ConfigEvent, ConfigStore
from meshpilot.config.unapplied import UnappliedConfig
from meshpilot.grpc_bind import bind
from meshpilot.kube.client import KubeError, client_from_kubeconfig
from meshpilot.kube.controller import KubeController, KubeOptions
from meshpilot.kube.leader import LeaseTimings
from meshpilot.kube.metrics import KubeMetrics
from meshpilot.kube.multicluster import registry_sink
from meshpilot.kube.namespaces import selectors_of
from meshpilot.kube.root_cert import RootCertPublisher
from meshpilot.kube.secret_access import KubeSecretAccess, NamespaceAccess, subject_access_review
from meshpilot.kube.webhook_ca import WebhookCaPatcher
from meshpilot.model.config import ConfigKey
from meshpilot.model.credentials import CredentialStore, SecretAccess, related_keys
from meshpilot.model.endpoint_index import EndpointIndex
from meshpilot.model.kind import Kind
from meshpilot.model.push_request import PushRequest, TriggerReason, config_request
from meshpilot.model.telemetry import unapplied as telemetry_unapplied
from meshpilot.networking.envoyfilter.patches import unapplied as envoy_filter_unapplied
from meshpilot.networking.envoyfilter.problems import PATCH_PROBLEMS
from meshpilot.networking.policy_problems import PROBLEMS
from meshpilot.networking.telemetry_problems import TELEMETRY_PROBLEMS
from meshpilot.pool import jwks as pool_jwks
from meshpilot.pool.change_log import ChangeLog, LoggedSink
from meshpilot.pool.debug_pages import PoolPages
from meshpilot.pool.metrics import PoolMetrics
from meshpilot.pool.ops import Attach, Authority, Detach, JwksKeys, Mesh, Push, Start
from meshpilot.pool.preview_connections import pool_connections
from meshpilot.pool.sizing import ephemeral_ports, resolve_workers
from meshpilot.pool.supervisor import PushWorkerPool
from meshpilot.push.debounce import DebounceOptions
from meshpilot.push.environment import MeshEnvironment
from meshpilot.push.jwks_resolver import JwksResolver
from meshpilot.push.preview_scratch import PreviewSources
from meshpilot.registry.aggregate import AggregateRegistry
from meshpilot.registry.kube.controller import KubeRegistry
from meshpilot.registry.serviceentry.controller import ServiceEntryRegistry
from meshpilot.server.build_info import control_plane_identifier
from meshpilot.server.debug import DebugHandlers, DebugSources
from meshpilot.server.debug_access import debug_access
from meshpilot.server.heartbeat import LoopHeartbeat
from meshpilot.server.http import DebugRoutes
from meshpilot.server.identity import IdentityPlane
from meshpilot.server.mesh_file import load_mesh_config
from meshpilot.server.metrics import Metrics
from meshpilot.server.object_router import ObjectRouter
from meshpilot.server.role import Role
from meshpilot.server.settings import DiscoverySettings
from meshpilot.webhooks.inject.config import InjectionError
from meshpilot.webhooks.inject.review import InjectionHandler, InjectionMetrics
from meshpilot.webhooks.inject.source import InjectConfigSource
from meshpilot.webhooks.server import WebhookServer
from meshpilot.xds.debug_access import DebugAccess
from meshpilot.xds.generators import SecretGenerator, sidecar_generators
from meshpilot.xds.generators.debug import debug_generators
from meshpilot.xds.server import DiscoveryOptions, DiscoveryServer

log = logging.getLogger(__name__)

#: istiod's gRPC server settings (pilot/pkg/grpc): 4 MiB requests, keepalive, 30-minute connections.
GRPC_OPTIONS = [
    ("grpc.max_receive_message_length", 4 * 1024 * 1024),
    ("grpc.max_send_message_length", 2**31 - 1),
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.max_connection_age_ms", 30 * 60 * 1000),
]

#: Kinds whose changes reach proxies through a registry rather than as config pushes.
_REGISTRY_KINDS = frozenset({Kind.SERVICE_ENTRY, Kind.WORKLOAD_ENTRY, Kind.WORKLOAD_GROUP})


class DiscoveryApp:
    """A running meshpilot discovery server (or one process of it: ``Role``)."""

    def __init__(
        self,
        settings: DiscoverySettings,
        *,
        after_load: Callable[[], None] | None = None,
        role: Role | None = None,
    ) -> None:
        settings = self.settings = resolve_workers(settings)
        self.role = role or (Role.MAIN if settings.push_workers > 1 else Role.SINGLE)
        #: The main process's record of every change, which its push workers apply (MAIN only).
        self.changes = ChangeLog() if self.role is Role.MAIN else None
        if self.role is Role.MAIN and (ephemeral := ephemeral_ports(settings)):
            raise ConfigError(
                f"--push-workers {settings.push_workers} needs fixed xDS ports: {ephemeral[0]} would "
                "give each worker a port of its own"
            )
        #: Called once the config sources were read, before serving (the process freezes the GC here).
        self._after_load = after_load
        self.metrics = Metrics()
        mesh = load_mesh_config(settings)
        self.store = ConfigStore()
        self.index = EndpointIndex()
        self.registry = AggregateRegistry([], [])
        kube_api: Any | None = None
        if settings.use_kube:
            try:
                kube_api = client_from_kubeconfig(settings.kubeconfig)
            except KubeError as err:
                raise ConfigError(str(err)) from None
        #: The Secrets SDS serves (credentialName), from the API and the config directory.
        self.credentials = CredentialStore(self._secret_changed)
        self.secret_access: SecretAccess = (
            KubeSecretAccess(subject_access_review(kube_api), self._secret_access_changed)
            if kube_api is not None
            else NamespaceAccess()
        )
        sds_errors = Counter_(
            "pilot_sds_certificate_errors",
            "Total number of failures to fetch SDS key and certificate.",
            registry=self.metrics.registry,
        )
        self.env = MeshEnvironment(
            store=self.store,
            registry=self.registry,
            index=self.index,
            mesh=mesh,
            domain_suffix=settings.domain,
            # PILOT_XDS_CACHE_SIZE=0 turns off every kind of sharing: each proxy's config is
            # built for it alone, as istiod builds it with its cache off (a way to rule the
            # cache and memo out when config looks wrong).
            share_outputs=settings.xds_cache_size > 0,
        )
        self.server = DiscoveryServer(
            self.env,
            self.metrics,
            DiscoveryOptions(
                debounce=DebounceOptions(settings.debounce_after, settings.debounce_max),
                push_throttle=settings.push_throttle,
                cluster_id=settings.cluster_id,
                cache_size=settings.xds_cache_size,
                max_requests_per_second=settings.max_requests_per_second,
                control_plane=control_plane_identifier(settings.pod_name),
            ),
            generators=sidecar_generators(
                SecretGenerator(self.credentials, self.secret_access, sds_errors.inc)
            ),
        )
        if self.changes is not None:
            self.changes.record(Mesh(mesh))
        #: Fetches the keys of RequestAuthentication jwksUris; new keys push the policies using them.
        self.jwks = JwksResolver(self._jwks_changed)
        self.env.jwks = self.jwks
        PROBLEMS.register(self.metrics.registry)
        PATCH_PROBLEMS.register(self.metrics.registry)
        TELEMETRY_PROBLEMS.register(self.metrics.registry)
        trust_domain = mesh.trust_domain
        self.kube = self.make_registry(settings.cluster_id)
        self.service_entries = ServiceEntryRegistry(
            self.store,
            self.server,
            cluster_id=settings.cluster_id,
            trust_domain=trust_domain,
            pods=self.kube,
        )
        self.registry.workloads.append(self.kube)
        self.registry.others.append(self.service_entries)
        self.store.add_handler(self._on_config)
        unapplied = UnappliedConfig(
            self.metrics.registry,
            {Kind.ENVOY_FILTER: envoy_filter_unapplied, Kind.TELEMETRY: telemetry_unapplied},
        )
        self.store.add_handler(unapplied.on_event)
        self.sources: list[FileSource] = []
        self.kube_controller: KubeController | None = None
        if self.role is not Role.WORKER:
            if settings.config_dir is not None:
                self.sources.append(FileSource(settings.config_dir, self._router()))
            if kube_api is not None:
                self.kube_controller = self._kube_controller(settings, kube_api)
        self.identity: IdentityPlane | None = None
        if settings.secure_grpc_addr is not None or settings.secure_grpc_client_cert_addr is not None:
            self.identity = IdentityPlane(
                settings,
                lambda: self.env.mesh.trust_domain,
                self.metrics.registry,
                kube_api,
                quiet=self.role is Role.WORKER,
            )
            self.server.authenticators = self.identity.authenticators
            self.server.trust_domains = self._trust_domains
            if kube_api is None and self.role is not Role.WORKER:
                # Files only: a bad CA stops the start at once. On Kubernetes the CA waits for the
                # API server in the background (see _run_identity), as the informers do. A push
                # worker is given the main process's.
                self.identity.load()
        self._kube_api = kube_api
        self.root_certs: RootCertPublisher | None = None
        self.webhook_ca: WebhookCaPatcher | None = None
        # Read at every scrape: files and the API both reject objects, at any time.
        self.metrics.config_rejections.set_function(self._rejection_count)
        for name in settings.unimplemented_settings:
            self.metrics.unimplemented_settings.labels(name).set(1)
        debug = DebugHandlers(DebugSources(self.server, self.store, self.index, self.registry.services))
        self.debug = debug
        #: The pages the HTTP and monitoring ports serve (with a pool: gathered from the workers).
        self.debug_pages: DebugRoutes = debug
        #: What ``/debug/preview`` reads (it copies, never writes).
        self.preview_sources = PreviewSources(
            self.server, self.env, self.service_entries, _REGISTRY_KINDS, self.kube
        )
        # istioctl's xDS types read the same pages and connections the HTTP debug port shows.
        # One rule for who reads what, over xDS and over HTTP (``debug_access``).
        self._root_namespace: str = mesh.root_namespace
        self.debug_rule = DebugAccess(settings.debug_endpoint_auth, settings.debug_auth_allowed_namespaces)
        self.server.generators.update(debug_generators(self.server, debug, self.debug_rule))
        self._stop = asyncio.Event()
        #: The main loop's heartbeat, which /ready and /healthz/live read (started by run()).
        self.heartbeat = LoopHeartbeat()
        self.grpc_server: grpc.aio.Server | None = None
        #: The secure ports' server, started once the CA is loaded.
        self.secure_server: grpc.aio.Server | None = None
        self.webhooks: WebhookServer | None = None
        self.inject_source: InjectConfigSource | None = None
        if settings.webhook_addr is not None and self.role is not Role.WORKER:
            self.webhooks = WebhookServer(
                settings.webhook_addr,
                self.metrics,
                lambda: self.server.ready,
                cert_file=settings.tls_cert_file,
                key_file=settings.tls_key_file,
                mesh_certificate=self.identity is not None,
            )
            # A bad injector directory stops the start with a clear message, as bad TLS flags do.
            try:
                inject_config = InjectConfigSource.load(settings.inject_config)
            except InjectionError as err:
                raise ConfigError(f"--inject-config {settings.inject_config}: {err}") from None
            # The mesh is read per pod, so on_mesh's new MeshConfig (defaultConfig) reaches the next one.
            handler = InjectionHandler(
                inject_config, InjectionMetrics.create(self.metrics.registry), lambda: self.env.mesh
            )
            self.webhooks.add_review_handler("/inject", handler)
            self.inject_source = InjectConfigSource(handler, settings.inject_config)
        #: The push workers (MAIN only; started by run()).
        self.pool: PushWorkerPool | None = None
        if self.changes is not None:
            self.pool = PushWorkerPool(settings, self.changes, self.metrics.registry, on_failure=self.stop)
            self.server.add_push_listener(self._record_push)
            pages = PoolPages(debug, self.pool)
            self.pool.handlers.update(pages.handlers())
            self.pool.handlers.update(pool_jwks.main_handlers(self.jwks))
            self._pool_metrics = PoolMetrics(self.metrics.registry, self.pool)
            self.debug_pages = pages
            self.preview_sources = dataclasses.replace(
                self.preview_sources, connections=pool_connections(self.pool, self.env, self.server)
            )

    def _router(self) -> ObjectSink:
        """Where the local sources write: the store, the credentials and the local registry; in the
        main process of a pool, also the change log."""
        router = ObjectRouter(self.store, self.kube, self.credentials)
        return router if self.changes is None else LoggedSink(router, self.changes)

    async def exposition(self) -> bytes:
        """A scrape of /metrics (with a pool: the workers' too, ``pool.metrics``)."""
        if self.pool is None:
            return self.metrics.exposition()
        return await self._pool_metrics.exposition()

    def _record_push(self, request: PushRequest) -> None:
        assert self.changes is not None and self.pool is not None
        seq = self.changes.push_seq + 1
        self.changes.record(Push.of(seq, request, request.number))
        self.pool.note_push(seq)

    @property
    def ready(self) -> bool:
        """Every port serves (with a pool: every push worker has served once)."""
        return self.server.ready and (self.pool is None or self.pool.ready)

    def debug_access(self) -> Middleware:
        """Who may read /debug on the HTTP and monitoring ports: token authentication, then the
        rule the xDS debug types apply, against the mesh root namespace as they use it."""

        def system_namespace() -> str:
            push = self.server.push_context
            return push.mesh.root_namespace if push is not None else self._root_namespace

        return debug_access(lambda: self.server.authenticators, system_namespace, self.debug_rule)

    def _jwks_changed(self, owners: frozenset[ConfigKey]) -> None:
        if self.changes is not None:
            # Before the push they cause: the workers serve the keys the main process holds.
            self.changes.record(JwksKeys(self.jwks.held()))
        self.server.config_update(
            PushRequest(full=True, configs_updated=owners, reasons=Counter({TriggerReason.CONFIG: 1}))
        )

    def _secret_changed(self, key: ConfigKey) -> None:
        """A Secret changed: the proxies watching it (or its ``-cacert`` twin) get SDS again."""
        self.server.config_update(
            PushRequest(
                full=False,
                configs_updated=frozenset(related_keys(key)),
                reasons=Counter({TriggerReason.SECRET: 1}),
            )
        )

    def _secret_access_changed(self, namespace: str) -> None:
        """A service account's access to its namespace's Secrets became known or changed."""
        self._secret_changed(ConfigKey(Kind.SECRET, "", namespace))

    def make_registry(self, cluster_id: str) -> KubeRegistry:
        """The Kubernetes registry of one cluster (the local one, or a remote one from a Secret)."""
        return KubeRegistry(
            self.server,
            cluster_id=cluster_id,
            domain_suffix=self.settings.domain,
            trust_domain=self.env.mesh.trust_domain,
        )

    def _kube_controller(self, settings: DiscoverySettings, api: Any) -> KubeController:
        changes = self.changes
        return KubeController(
            api,
            self._router(),
            options=KubeOptions(
                istio_namespace=settings.istio_namespace,
                cluster_id=settings.cluster_id,
                lease=LeaseTimings.for_duration(settings.lease_duration),
                enable_status=settings.enable_status,
                watch_mesh=settings.mesh_config is None,
                remote_cluster_timeout=settings.remote_cluster_timeout,
            ),
            metrics=KubeMetrics.create(self.metrics.registry),
            on_mesh=self.on_mesh,
            make_registry=self.make_registry,
            attach=self._attach,
            detach=self._detach,
            mesh=self.env.mesh if settings.mesh_config is not None else None,
            remote_sink=(
                None
                if changes is None
                else lambda registry: LoggedSink(registry_sink(registry), changes, registry.cluster_id)
            ),
        )

    def _attach(self, registry: KubeRegistry) -> None:
        self.registry.workloads.append(registry)
        if self.changes is not None:
            self.changes.record(Attach(registry.cluster_id))

    def _detach(self, registry: KubeRegistry) -> None:
        self.registry.workloads.remove(registry)
        if self.changes is not None:
            self.changes.record(Detach(registry.cluster_id))

    def _rejection_count(self) -> float:
        count = sum(len(source.rejections) for source in self.sources)
        if self.kube_controller is not None:
            count += len(self.kube_controller.source.rejections)
        return float(count)

    def _trust_domains(self) -> tuple[str, ...]:
        mesh = self.env.mesh
        return (mesh.trust_domain, *mesh.trust_domain_aliases)

    def on_mesh(self, mesh: Any) -> None:
        """A new MeshConfig (from the ConfigMap): everything may change, so every proxy gets a full push."""
        self.env.mesh = mesh
        if self.changes is not None:
            self.changes.record(Mesh(mesh))
        if self.root_certs is not None:
            self.root_certs.set_discovery_selectors(selectors_of(mesh))
        if self.server.ready:
            log.info("MeshConfig changed: pushing to all proxies")
            self.server.config_update(PushRequest(full=True, reasons=Counter({TriggerReason.GLOBAL: 1})))

    def _on_config(self, event: ConfigEvent) -> None:
        if event.config.kind in _REGISTRY_KINDS:
            return
        self.server.history.note_change(event.config.key, event.type.value)
        self.server.config_update(config_request(event.config.key))

    async def load(self) -> None:
        """Read every config source once (the Kubernetes lists too); the server is ready afterwards."""
        if self.kube_controller is not None:
            self.kube_controller.start()
            log.info("waiting for the initial lists from the Kubernetes API")
            await self.kube_controller.wait_synced()
        for source in self.sources:
            await source.refresh()  # files are read off the loop: a stop still gets through
            log.info(
                "loaded %d objects from %s (%d rejected)",
                source.object_count(),
                source.root,
                len(source.rejections),
            )
        if self.identity is not None:
            # Ready means every port serves: the CA (on Kubernetes, once the API server answers), the
            # webhooks that serve its certificate and the secure ports come up before /ready says so.
            if not self.identity.loaded and not await self.identity.load_until_ready(self._stop):
                return
            await self._serve_identity(self.identity)
            if self.changes is not None:
                self.changes.record(Authority(self.identity.files()))
        if self._after_load is not None:
            self._after_load()
        self.server.start_serving()
        if self.changes is not None:
            push = self.server.push_context
            assert push is not None
            self.changes.record(
                Start(push.version, self.changes.push_seq, self.server.history.pushes_started)
            )

    def stop(self) -> None:
        self._stop.set()

    @property
    def stopping(self) -> asyncio.Event:
        """Set by ``stop``."""
        return self._stop

    def xds_server(self) -> grpc.aio.Server:
        """The plaintext xDS port's server, not started. Bound with SO_REUSEPORT (gRPC's default on
        Linux), which is what lets push workers share the port."""
        server = grpc.aio.server(options=GRPC_OPTIONS)
        server.add_generic_rpc_handlers([self.server.grpc_handler()])
        address = self.settings.grpc_addr
        bind(server, address.grpc_target, "xDS", where=str(address))
        self.grpc_server = server
        return server

    async def _serve_identity(self, identity: IdentityPlane) -> None:
        """With the CA loaded: the webhooks that serve its certificate, the secure ports, the root
        published."""
        if self.webhooks is not None and self.webhooks.serves_mesh_certificate:
            self.webhooks.serving = identity.serving
            await self.webhooks.start()
        if self.pool is None:
            await self.serve_secure(identity)
        if self.role is not Role.WORKER:
            self._start_publishing_root()

    async def serve_secure(self, identity: IdentityPlane) -> None:
        """The secure ports (ADS and CreateCertificate), with the CA ``identity`` has."""
        # The secure ports have a server of their own: the CA must not answer on the plaintext port.
        secure = grpc.aio.server(options=GRPC_OPTIONS)
        secure.add_generic_rpc_handlers([self.server.grpc_handler(secure=True)])
        bound = identity.add_ports(secure)
        await secure.start()
        self.secure_server = secure
        log.info("secure xDS and the CA serving on %s", ", ".join(bound))

    def _start_publishing_root(self) -> None:
        """On Kubernetes: the root as the ``istio-ca-root-cert`` ConfigMap of every watched namespace,
        and as the caBundle of istiod's webhooks when they serve the CA's certificate. The ConfigMaps
        are written by the leader of the replicas only; every replica patches the webhooks, as istiod's
        do (each revision its own)."""
        if self.identity is None or self._kube_api is None:
            return
        root = self.identity.authority.root_pem
        self.root_certs = RootCertPublisher(
            self._kube_api,
            root,
            selectors=selectors_of(self.env.mesh),
            registry=self.metrics.registry,
            lease_namespace=self.settings.istio_namespace,
            lease=LeaseTimings.for_duration(self.settings.lease_duration),
        )
        self.root_certs.start()
        if self.webhooks is not None and self.webhooks.serves_mesh_certificate:
            self.webhook_ca = WebhookCaPatcher(self._kube_api, root)
            self.webhook_ca.start()
