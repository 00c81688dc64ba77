"""``meshpilot agent proxy sidecar|router``: pilot-agent's ``proxy`` command line, flag for flag, so an
injected pod runs unchanged with ``meshpilot agent`` in place of ``pilot-agent``.

Flags pilot-agent has that this agent does not act on (``--stsPort``, ``--tokenManagerPlugin``,
``--outlierLogPath``, ``--profiling``, and the logging flags other than ``--log_output_level``) are
accepted and ignored, as pilot-agent accepts unknown flags.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from meshpilot.agent.settings import NODE_TYPES, Flags, SettingsError, load_settings

log = logging.getLogger(__name__)

#: Istio's scope levels, mapped to Python's.
LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warn": logging.WARNING,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "fatal": logging.CRITICAL,
    "none": logging.CRITICAL + 10,
}


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``proxy`` under ``meshpilot agent``."""
    proxy = sub.add_parser(
        "proxy",
        help="run Envoy as pilot-agent does: bootstrap, SDS, xDS proxy, status server",
        description="Run an Envoy sidecar or gateway the way `pilot-agent proxy` does, in the working "
        "directory, which stands in for the container's root.",
    )
    proxy.add_argument("type", nargs="?", default="sidecar", choices=NODE_TYPES, help="proxy type")
    proxy.add_argument(
        "--domain", default="", help="DNS domain suffix (default: $POD_NAMESPACE.svc.cluster.local)"
    )
    proxy.add_argument(
        "--meshConfig", default="./etc/istio/config/mesh", help="mesh config file (defaultConfig)"
    )
    proxy.add_argument("--serviceCluster", default="istio-proxy", help="service cluster (deprecated)")
    proxy.add_argument("--proxyLogLevel", default="warning", help="Envoy's log level, e.g. info,misc:error")
    proxy.add_argument("--proxyComponentLogLevel", default="", help="Envoy's component log levels")
    proxy.add_argument("--concurrency", type=int, default=0, help="Envoy worker threads (deprecated)")
    proxy.add_argument("--templateFile", default="", help="accepted; a custom template is not supported")
    proxy.add_argument("--log_output_level", default="default:info", help="the agent's own log levels")
    for ignored in IGNORED_FLAGS:
        proxy.add_argument(ignored, default=None, help=argparse.SUPPRESS)
    proxy.set_defaults(run=run_proxy)


def configure_logging(levels: str) -> None:
    """``--log_output_level=default:info,xdsproxy:debug``: the default scope sets the agent's level."""
    level = logging.INFO
    for item in levels.split(","):
        scope, _, name = item.rpartition(":")
        if scope in ("", "default") and name in LEVELS:
            level = LEVELS[name]
    logging.basicConfig(
        level=level,
        stream=sys.stderr,
        format="%(asctime)s\t%(levelname)s\t%(name)s\t%(message)s",
    )


def flags_from(args: argparse.Namespace) -> Flags:
    return Flags(
        node_type=args.type,
        domain=args.domain,
        mesh_config=args.meshConfig,
        service_cluster=args.serviceCluster,
        proxy_log_level=args.proxyLogLevel,
        proxy_component_log_level=args.proxyComponentLogLevel,
        concurrency=args.concurrency,
        template_file=args.templateFile,
        log_output_level=args.log_output_level,
    )


#: pilot-agent flags taken so its pod specs run, but without effect here (each is logged when given).
IGNORED_FLAGS = ("--stsPort", "--tokenManagerPlugin", "--outlierLogPath", "--profiling", "--log_as_json")
#: PILOT_CERT_PROVIDER values meshpilot agent serves: istiod's CA (the injector's default).
CERT_PROVIDERS = ("", "istiod")


def run_proxy(args: argparse.Namespace) -> int:
    configure_logging(args.log_output_level)
    if args.templateFile:
        log.warning("--templateFile is not supported; the built-in bootstrap is used")
    for flag in IGNORED_FLAGS:
        value = getattr(args, flag.removeprefix("--"))
        if value is not None:
            log.warning("%s=%s is accepted for pilot-agent's pod specs but has no effect", flag, value)
    provider = os.environ.get("PILOT_CERT_PROVIDER", "")
    if provider not in CERT_PROVIDERS:
        print(
            f"meshpilot agent: PILOT_CERT_PROVIDER={provider} is not supported; only istiod's CA is",
            file=sys.stderr,
        )
        return 2
    try:
        settings = load_settings(flags_from(args), os.environ, Path.cwd())
    except SettingsError as err:
        print(f"meshpilot agent: {err}", file=sys.stderr)
        return 2
    from meshpilot.agent.run import main

    return main(settings)
