"""``meshpilot agent proxy``: the composition of the agent's parts, in pilot-agent's order.

Start: settings → workload certificate (mounted files, else the CA) → SDS server → xDS proxy → bootstrap
→ status server → Envoy. Stop (SIGTERM or SIGINT): Envoy is drained and stopped first (it is the only
thing serving the app's traffic), then the status server, the xDS proxy, the SDS server, certificate
rotation and the CA client, in reverse order of their start; each step is bounded.

Identity (pilot-agent's rules, ``pkg/istio-agent/agent.go``): with controlPlaneAuthPolicy MUTUAL_TLS
(the default) the xDS proxy and the CA client talk TLS to istiod, verified against the first of
``XDS_ROOT_CA``, ``./etc/certs/root-cert.pem``, ``./var/run/secrets/istio/root-cert.pem``, under the name
``ISTIOD_SAN`` (default: the discoveryAddress host); the token is
``./var/run/secrets/tokens/istio-token``, read again on every call. If
``./var/run/secrets/workload-spiffe-credentials/{cert-chain,key,root-cert}.pem`` exist they are served
and the CA is not called.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from meshpilot.agent.bootstrap import write_bootstrap
from meshpilot.agent.envoy import EnvoyOptions, EnvoyProcess
from meshpilot.agent.sds import CredentialSource, WorkloadCredentials, serve_sds
from meshpilot.agent.settings import (
    TOKEN_PATH,
    WORKLOAD_CREDENTIALS_DIR,
    WORKLOAD_SOCKET_DIR,
    XDS_ROOT_CANDIDATES,
    AgentSettings,
    SettingsError,
)
from meshpilot.agent.status import StatusOptions, StatusServer
from meshpilot.server.settings import duration_seconds

log = logging.getLogger(__name__)

CREDENTIAL_FILES = ("cert-chain.pem", "key.pem", "root-cert.pem")
#: Grace for open xDS and SDS streams when the agent stops.
STREAM_GRACE = 1.0


class AgentError(RuntimeError):
    """The agent cannot start: the message says what is missing or wrong."""


def token_reader(settings: AgentSettings) -> Callable[[], str | None]:
    """The service-account token, read on every call (the kubelet rotates it); None when absent."""
    path = settings.path(TOKEN_PATH)

    def read() -> str | None:
        try:
            return path.read_text().strip() or None
        except FileNotFoundError:
            return None
        except OSError as err:
            log.warning("cannot read the token %s: %s", path, err)
            return None

    return read


def _secret_lifetime(settings: AgentSettings) -> tuple[int, float]:
    """pilot-agent's SECRET_TTL (a Go duration, 24h) and SECRET_GRACE_PERIOD_RATIO (0.5: renew with half
    the life left)."""
    ttl_text = settings.environ.get("SECRET_TTL", "") or "24h"
    ratio_text = settings.environ.get("SECRET_GRACE_PERIOD_RATIO", "") or "0.5"
    try:
        ttl = duration_seconds(ttl_text)
    except ValueError:
        raise AgentError(f"SECRET_TTL: invalid duration {ttl_text!r}") from None
    try:
        ratio = float(ratio_text)
    except ValueError:
        ratio = -1.0
    if ttl < 1 or not 0 < ratio < 1:
        raise AgentError(
            f"SECRET_TTL {ttl_text!r} must be at least 1s and SECRET_GRACE_PERIOD_RATIO {ratio_text!r} "
            "between 0 and 1"
        )
    return int(ttl), ratio


def xds_root(settings: AgentSettings) -> bytes:
    """The root that istiod's certificate must chain to. An explicit ``XDS_ROOT_CA`` must load: the
    operator's choice is never swapped for a mounted root in silence."""
    if settings.xds_root_ca == "SYSTEM":
        raise AgentError(
            "XDS_ROOT_CA=SYSTEM (the system's roots for istiod) is not supported by meshpilot agent"
        )
    if settings.xds_root_ca:
        explicit = settings.path(Path(settings.xds_root_ca))
        try:
            return explicit.read_bytes()
        except OSError as err:
            raise AgentError(f"cannot read XDS_ROOT_CA {explicit}: {err}") from None
    candidates = [settings.path(p) for p in XDS_ROOT_CANDIDATES]
    for path in candidates:
        if path.is_file():
            try:
                return path.read_bytes()
            except OSError as err:
                raise AgentError(f"cannot read istiod's root {path}: {err}") from None
    raise AgentError(
        "no root certificate to verify istiod with (controlPlaneAuthPolicy MUTUAL_TLS): looked for "
        + ", ".join(str(c) for c in candidates)
    )


def mounted_credentials(settings: AgentSettings) -> WorkloadCredentials | None:
    directory = settings.path(WORKLOAD_CREDENTIALS_DIR)
    files = [directory / name for name in CREDENTIAL_FILES]
    if not all(f.is_file() for f in files):
        return None
    try:
        return WorkloadCredentials.from_files(*files)
    except OSError as err:
        raise AgentError(f"cannot read the mounted workload certificate in {directory}: {err}") from None


def envoy_options(settings: AgentSettings, config_file: Path) -> EnvoyOptions:
    return EnvoyOptions(
        binary=settings.binary_path,
        config_file=config_file,
        cwd=settings.root,
        admin_port=settings.admin_port,
        drain_duration=settings.drain_duration,
        termination_drain_duration=settings.termination_drain_duration,
        concurrency=settings.concurrency,
        log_level=settings.flags.proxy_log_level,
        component_log_level=settings.flags.proxy_component_log_level,
        skip_deprecated_logs=settings.skip_deprecated_logs,
        ipv6=all(":" in ip for ip in settings.ip_addresses),
        sidecar=settings.flags.node_type == "sidecar",
    )


@contextlib.asynccontextmanager
async def _credentials(
    settings: AgentSettings, stop: asyncio.Event, root: bytes | None
) -> AsyncIterator[WorkloadCredentials | CredentialSource]:
    """The SDS source: the mounted files, else certificates from the CA, rotated until ``stop``."""
    mounted = mounted_credentials(settings)
    if mounted is not None:
        log.info("workload is using file mounted certificates; skipping connecting to the CA")
        yield mounted
        return
    from meshpilot.agent.ca_client import CaClient, key_algorithm
    from meshpilot.agent.workload_secrets import WorkloadSecrets

    ca_root = root if root is not None else xds_root(settings)
    ca = CaClient(
        settings.ca_address,
        root_pem=ca_root,
        token=token_reader(settings),
        server_name=settings.pilot_san,
        cluster_id=settings.cluster_id,
    )
    try:
        ttl, grace = _secret_lifetime(settings)
        secrets = WorkloadSecrets(
            ca,
            root_pem=ca_root,
            ttl_seconds=ttl,
            grace_ratio=grace,
            algorithm=key_algorithm(settings.environ.get("ECC_SIGNATURE_ALGORITHM", "")),
        )
        await secrets.start()
        rotation = asyncio.create_task(secrets.run(stop))
        try:
            yield secrets
        finally:
            stop.set()
            rotation.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await rotation
    finally:
        await ca.close()


async def run_agent(settings: AgentSettings, stop: asyncio.Event | None = None) -> None:
    """Run until ``stop`` is set (by SIGTERM or SIGINT when none is given); raises AgentError on a bad
    input. The working directory must be ``settings.root``: sockets are bound by relative path, as Envoy
    finds them, which keeps them under the 108-byte limit of a Unix socket path."""
    if stop is None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
    rotation_stop = asyncio.Event()
    root = xds_root(settings) if settings.mutual_tls else None
    async with contextlib.AsyncExitStack() as stack:
        source = await stack.enter_async_context(_credentials(settings, rotation_stop, root))
        sds_socket = settings.path(WORKLOAD_SOCKET_DIR / "socket")
        sds_socket.parent.mkdir(parents=True, exist_ok=True)
        sds_socket.unlink(missing_ok=True)
        sds_server, _ = await serve_sds(source, f"unix:{WORKLOAD_SOCKET_DIR / 'socket'}")
        stack.push_async_callback(sds_server.stop, STREAM_GRACE)

        from meshpilot.agent.xds_proxy import XdsProxy

        proxy = XdsProxy(
            settings.discovery_address,
            root_pem=root,
            token=token_reader(settings),
            server_name=settings.pilot_san if root is not None else None,
            cluster_id=settings.cluster_id,
        )
        await proxy.start(settings.path(settings.config_path / "XDS"))
        stack.push_async_callback(proxy.stop, STREAM_GRACE)

        config_file = write_bootstrap(settings)
        log.info("wrote Envoy's bootstrap %s (node %s)", config_file, settings.node_id)

        status: StatusServer | None = None
        if settings.status_port > 0:
            ip = settings.ip_addresses[0]
            legacy = settings.environ.get("REWRITE_PROBE_LEGACY_LOCALHOST_DESTINATION", "").lower() == "true"
            status = StatusServer(
                StatusOptions(
                    port=settings.status_port,
                    admin_port=settings.admin_port,
                    prometheus_port=settings.envoy_prometheus_port,
                    app_probers=settings.app_probers,
                    probe_host="localhost" if legacy else ip,
                )
            )
            await stack.enter_async_context(status)

        envoy = EnvoyProcess(
            envoy_options(settings, config_file),
            on_start=status.reset_readiness if status is not None else None,
        )
        await envoy.run(stop)
    log.info("agent stopped")


def main(settings: AgentSettings) -> int:
    """Run the agent; the process exit code (0 after a clean stop)."""
    try:
        asyncio.run(run_agent(settings))
    except (AgentError, SettingsError) as err:
        print(f"meshpilot agent: {err}", file=sys.stderr, flush=True)
        return 2
    except (OSError, RuntimeError) as err:
        # RuntimeError: no workload certificate from the CA (NoCertificateError) among others.
        print(f"meshpilot agent: {err}", file=sys.stderr, flush=True)
        return 1
    return 0
