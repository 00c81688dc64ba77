"""``meshpilot``: the command line."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from meshpilot import __version__
from meshpilot.ca.mesh_ca import CaSettings
from meshpilot.cli import explain, istiod_compat, preview, validate
from meshpilot.config.errors import ConfigError
from meshpilot.pool.sizing import MAX_DEFAULT_WORKERS, MAX_WORKERS
from meshpilot.server import logs
from meshpilot.server.settings import Address, DiscoverySettings, duration_seconds, env_default


def _address(text: str) -> Address:
    try:
        return Address.parse(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _optional_address(text: str) -> Address | None:
    if text.strip().lower() in ("", "off"):
        return None
    return _address(text)


def _duration(text: str) -> float:
    try:
        return duration_seconds(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _push_workers(text: str) -> int:
    """A worker count; 0 is one per usable core, capped (decided at start: ``pool.sizing``)."""
    try:
        count = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid worker count {text!r}") from None
    if not 0 <= count <= MAX_WORKERS:
        raise argparse.ArgumentTypeError(f"invalid worker count {text!r}: 0 to {MAX_WORKERS}")
    return count


def _push_throttle(text: str) -> int:
    """Concurrent pushes; 0 is the automatic value (``xds.server.default_push_throttle``)."""
    try:
        count = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid push throttle {text!r}") from None
    if count < 0:
        raise argparse.ArgumentTypeError(f"invalid push throttle {text!r}: 0 (automatic) or more")
    return count


def _add_discovery(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "discovery",
        help="run the discovery server (istiod's pilot-discovery)",
        description="Serve xDS to Envoy sidecars from config files and/or the Kubernetes API.",
    )
    # istiod's camelCase flag names are accepted too, so existing manifests work.
    p.add_argument(
        "--config-dir", "--configDir", type=Path, help="directory of YAML/JSON config to load and watch"
    )
    p.add_argument(
        "--mesh-config", "--meshConfig", type=Path, help="MeshConfig YAML file (istiod's defaults if unset)"
    )
    p.add_argument(
        "--grpc-addr",
        "--grpcAddr",
        type=_address,
        default=Address("", 15010),
        help="plaintext xDS address (default :15010)",
    )
    p.add_argument(
        "--secure-grpc-addr",
        "--secureGRPCAddr",
        type=_optional_address,
        default=Address("", 15012),
        help="TLS address of xDS and the CA, for agents with a token; 'off' disables (default :15012)",
    )
    p.add_argument(
        "--secure-grpc-client-cert-addr",
        type=_optional_address,
        default=None,
        help="TLS address of xDS and the CA that requires a client certificate of the mesh (default off)",
    )
    p.add_argument(
        "--self-signed-ca-dir",
        type=Path,
        default=os.environ.get("MESHPILOT_SELF_SIGNED_CA_DIR") or None,
        help="off Kubernetes, where the self-signed root is kept across restarts "
        "(default $MESHPILOT_SELF_SIGNED_CA_DIR; unset: a root for this run only)",
    )
    p.add_argument(
        "--ca-key-algorithm",
        choices=("rsa", "ecdsa"),
        default="rsa",
        help="key of a self-signed root: rsa (2048 bits, istiod's default) or ecdsa (P-256)",
    )
    p.add_argument(
        "--http-addr",
        "--httpAddr",
        type=_address,
        default=Address("", 8080),
        help="HTTP address for /ready and /debug (default :8080)",
    )
    p.add_argument(
        "--monitoring-addr",
        "--monitoringAddr",
        type=_address,
        default=Address("", 15014),
        help="address for /metrics and /debug (default :15014)",
    )
    p.add_argument(
        "--debug-on-http",
        action=argparse.BooleanOptionalAction,
        default=env_default("ENABLE_DEBUG_ON_HTTP", "true").lower() != "false",
        help="serve /debug on the HTTP port too; either port answers loopback callers, others only "
        "with a token the xDS authenticators accept ($ENABLE_DEBUG_ON_HTTP)",
    )
    p.add_argument(
        "--webhook-addr",
        "--httpsAddr",
        type=_optional_address,
        default=Address("", 15017),
        help="HTTPS address of the /validate webhook and /ready; empty or 'off' disables (default :15017)",
    )
    p.add_argument("--tls-cert-file", "--tlsCertFile", type=Path, help="webhook serving certificate (PEM)")
    p.add_argument(
        "--tls-key-file", "--tlsKeyFile", type=Path, help="key of --tls-cert-file (self-signed if both unset)"
    )
    p.add_argument(
        "--inject-config",
        "--injectConfig",
        type=Path,
        help="directory with the injector's config and values files, watched (default: built-in template)",
    )
    p.add_argument(
        "--kubeconfig",
        type=Path,
        help="read from the Kubernetes API with this kubeconfig (in a pod, in-cluster credentials are used)",
    )
    p.add_argument(
        "--istio-namespace",
        "-a",
        "--istioNamespace",
        "--namespace",
        "-n",
        default=env_default("POD_NAMESPACE", "istio-system"),
        help="namespace of the mesh ConfigMap, multicluster Secrets and Leases (default $POD_NAMESPACE)",
    )
    p.add_argument(
        "--enable-status",
        action=argparse.BooleanOptionalAction,
        default=env_default("PILOT_ENABLE_STATUS", "false").lower() == "true",
        help="the leader writes status.observedGeneration on Istio config (default $PILOT_ENABLE_STATUS)",
    )
    p.add_argument(
        "--lease-duration",
        type=_duration,
        default="30s",
        help="leader election Lease duration; renew deadline and retry are 1/2 and 1/4 of it (default 30s)",
    )
    p.add_argument(
        "--remote-cluster-timeout",
        type=_duration,
        default=env_default("PILOT_REMOTE_CLUSTER_TIMEOUT", "30s"),
        help="how long readiness waits for remote clusters; 0 does not wait ($PILOT_REMOTE_CLUSTER_TIMEOUT)",
    )
    p.add_argument("--domain", default="cluster.local", help="DNS domain suffix (default cluster.local)")
    p.add_argument(
        "--cluster-id",
        "--clusterID",
        default=env_default("CLUSTER_ID", "Kubernetes"),
        help="ID of the local cluster (default $CLUSTER_ID or Kubernetes)",
    )
    p.add_argument(
        "--debounce-after",
        type=_duration,
        default=env_default("PILOT_DEBOUNCE_AFTER", "100ms"),
        help="quiet period before a push (default $PILOT_DEBOUNCE_AFTER or 100ms)",
    )
    p.add_argument(
        "--debounce-max",
        type=_duration,
        default=env_default("PILOT_DEBOUNCE_MAX", "10s"),
        help="longest delay of a push (default $PILOT_DEBOUNCE_MAX or 10s)",
    )
    p.add_argument(
        "--push-throttle",
        type=_push_throttle,
        default=env_default("PILOT_PUSH_THROTTLE", "0"),
        help=(
            "concurrent pushes, split among push workers; 0: 100 per process "
            "(default $PILOT_PUSH_THROTTLE or 0)"
        ),
    )
    p.add_argument(
        "--push-workers",
        type=_push_workers,
        default=env_default("MESHPILOT_PUSH_WORKERS", "0"),
        help="processes serving xDS, sharing its ports; 0 means one per usable core (the CPUs "
        "the process may run on, within its cgroup's CPU limit and $GOMAXPROCS; at most "
        f"{MAX_DEFAULT_WORKERS}); 1 serves everything from one process (default "
        "$MESHPILOT_PUSH_WORKERS or 0)",
    )
    cache_default = env_default("PILOT_XDS_CACHE_SIZE", "60000")
    if env_default("PILOT_ENABLE_XDS_CACHE", "true").lower() == "false":
        cache_default = "0"
    p.add_argument(
        "--xds-cache-size",
        type=int,
        default=int(cache_default),
        help=(
            "XdsCache entries per type; 0 turns off the cache and all sharing of generated config "
            "(default $PILOT_XDS_CACHE_SIZE or 60000)"
        ),
    )
    p.add_argument(
        "--max-requests-per-second",
        type=float,
        default=float(env_default("PILOT_MAX_REQUESTS_PER_SECOND", "0")),
        help="new xDS streams per second; 0 means min(15+5*CPUs, 100) ($PILOT_MAX_REQUESTS_PER_SECOND)",
    )
    p.add_argument(
        "--debug-endpoint-auth",
        action=argparse.BooleanOptionalAction,
        default=env_default("ENABLE_DEBUG_ENDPOINT_AUTH", "true").lower() != "false",
        help="debug data (xDS types, /debug pages) only for verified identities, scoped to their namespace "
        "outside the system one; --no-debug-endpoint-auth opens it to any authenticated caller and the "
        "xDS status types on the plaintext port ($ENABLE_DEBUG_ENDPOINT_AUTH)",
    )
    logs.add_log_flags(p)
    # Last: istiod's flags meshpilot does not define above (Istio's chart passes them unchanged).
    istiod_compat.add_istiod_flags(p)
    p.set_defaults(run=_run_discovery)


def _run_discovery(args: argparse.Namespace) -> int:
    try:
        unknown_scopes = logs.configure(logs.options_from(args))
    except ValueError as err:
        print(f"meshpilot: {err}", file=sys.stderr)
        return 2
    logs.report_unknown_scopes(unknown_scopes)
    from meshpilot.server.allocator import log_choice

    log_choice(args.allocator)
    compat = istiod_compat.startup_report(args, os.environ)
    istiod_compat.log_report(compat)
    if compat.refused:
        return 2
    if args.config_dir is not None and not args.config_dir.is_dir():
        print(f"meshpilot: --config-dir {args.config_dir} is not a directory", file=sys.stderr)
        return 2
    from meshpilot.kube.client import in_cluster

    settings = DiscoverySettings(
        config_dir=args.config_dir,
        mesh_config=args.mesh_config,
        grpc_addr=args.grpc_addr,
        secure_grpc_addr=args.secure_grpc_addr,
        secure_grpc_client_cert_addr=args.secure_grpc_client_cert_addr,
        ca=CaSettings(
            root_ca_dir=Path(env_default("ROOT_CA_DIR", "./etc/cacerts")),
            self_signed_dir=args.self_signed_ca_dir,
            algorithm=args.ca_key_algorithm,
        ),
        http_addr=args.http_addr,
        debug_on_http=args.debug_on_http,
        monitoring_addr=args.monitoring_addr,
        webhook_addr=args.webhook_addr,
        tls_cert_file=args.tls_cert_file,
        tls_key_file=args.tls_key_file,
        inject_config=args.inject_config,
        kubeconfig=args.kubeconfig,
        use_kube=args.kubeconfig is not None or (args.config_dir is None and in_cluster()),
        istio_namespace=args.istio_namespace,
        enable_status=args.enable_status,
        lease_duration=args.lease_duration,
        remote_cluster_timeout=args.remote_cluster_timeout,
        domain=args.domain,
        cluster_id=args.cluster_id,
        debounce_after=args.debounce_after,
        debounce_max=args.debounce_max,
        push_throttle=args.push_throttle,
        push_workers=args.push_workers,
        xds_cache_size=args.xds_cache_size,
        max_requests_per_second=args.max_requests_per_second,
        debug_endpoint_auth=args.debug_endpoint_auth,
        debug_auth_allowed_namespaces=frozenset(
            n for n in env_default("DEBUG_ENDPOINT_AUTH_ALLOWED_NAMESPACES", "").split(",") if n
        ),
        pod_name=env_default("POD_NAME", ""),
        log_level=args.log_level,
        unimplemented_settings=compat.unimplemented_names,
    )
    from meshpilot.server.run import serve

    try:
        asyncio.run(serve(settings))
    except ConfigError as err:
        print(f"meshpilot: {err}", file=sys.stderr)
        return 2
    except OSError as err:
        print(f"meshpilot: {err}", file=sys.stderr)
        return 1
    return 0


def _add_agent(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    agent = sub.add_parser("agent", help="proxy-side agent pieces (pilot-agent)")
    agent_sub = agent.add_subparsers(dest="agent_command", required=True)
    sds = agent_sub.add_parser(
        "sds",
        help="serve a workload certificate to Envoy over SDS",
        description="Serve the secrets 'default' (certificate chain and key) and 'ROOTCA' (roots) "
        "to Envoy's sds-grpc cluster, from PEM files.",
    )
    sds.add_argument("--address", required=True, help="listen address: unix:///path/to/socket or HOST:PORT")
    sds.add_argument("--cert-chain", type=Path, required=True, help="PEM certificate chain, leaf first")
    sds.add_argument("--key", type=Path, required=True, help="PEM private key of the leaf")
    sds.add_argument("--root-cert", type=Path, required=True, help="PEM roots that peers' chains end in")
    sds.add_argument("--log-level", default="info", choices=sorted(logs.LEVELS))
    sds.set_defaults(run=_run_sds)
    from meshpilot.agent.command import add_parser as add_proxy

    add_proxy(agent_sub)


def _run_sds(args: argparse.Namespace) -> int:
    logs.configure(args.log_level)
    from meshpilot.agent.sds import WorkloadCredentials, serve_sds

    try:
        credentials = WorkloadCredentials.from_files(args.cert_chain, args.key, args.root_cert)
    except OSError as err:
        print(f"meshpilot: cannot read credentials: {err}", file=sys.stderr)
        return 2

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        server, _ = await serve_sds(credentials, args.address)
        await stop.wait()
        await server.stop(1)

    try:
        asyncio.run(run())
    except OSError as err:
        print(f"meshpilot: {err}", file=sys.stderr)
        return 1
    return 0


def _add_kube_inject(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "kube-inject",
        help="inject the Istio sidecar into Kubernetes manifests (istioctl kube-inject)",
        description="Write the manifests of FILE to stdout with the sidecar added to every pod template.",
    )
    p.add_argument("-f", "--filename", required=True, help="manifest file, or - for stdin")
    p.add_argument(
        "--inject-config",
        "--injectConfig",
        "--injectConfigDir",
        type=Path,
        help="directory with the istio-sidecar-injector ConfigMap's 'config' and 'values' files",
    )
    p.set_defaults(run=_run_kube_inject)


def _run_kube_inject(args: argparse.Namespace) -> int:
    from meshpilot.webhooks.inject.config import InjectionError
    from meshpilot.webhooks.inject.kube_inject import kube_inject
    from meshpilot.webhooks.inject.source import InjectConfigSource

    try:
        # Templates are parsed up front, as the webhook does, so a broken one fails before any output.
        config = InjectConfigSource.load(args.inject_config)
        text = sys.stdin.read() if args.filename == "-" else Path(args.filename).read_text()
        out = kube_inject(text, config, lambda msg: print(msg, file=sys.stderr))
    except (InjectionError, OSError, UnicodeDecodeError) as err:
        print(f"meshpilot: {err}", file=sys.stderr)
        return 2
    sys.stdout.write(out)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="meshpilot", description="A drop-in replacement for istiod.")
    parser.add_argument("--version", action="version", version=f"meshpilot {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_discovery(sub)
    _add_agent(sub)
    # istio-iptables' own flags are parsed by meshpilot.iptables, so its argv passes through untouched.
    # (main() hands them over before this parser sees them; listed here for --help.)
    sub.add_parser("iptables", help="set up a sidecar's traffic capture (istio-iptables)", add_help=False)
    validate.add_parser(sub)
    preview.add_parser(sub)
    explain.add_parser(sub)
    _add_kube_inject(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    as_program = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["iptables"]:
        from meshpilot.iptables.command import main as iptables_main

        return iptables_main(argv[1:])
    args = build_parser().parse_args(argv)
    if args.command == "discovery":
        from meshpilot.server import allocator

        # Before the server allocates anything: this may run the command again under jemalloc.
        try:
            args.allocator = allocator.prepare(argv, reexec=as_program)
        except allocator.AllocatorError as err:
            print(f"meshpilot: {err}", file=sys.stderr)
            return 2
    code: int = args.run(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
