"""`meshpilot iptables`: istio-iptables' command line (same flags, same argv)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from meshpilot.iptables import runner
from meshpilot.iptables.config import CaptureConfig


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="meshpilot iptables",
        description="Set up (or with `clean`, remove) a sidecar's traffic capture, as istio-iptables.",
    )
    p.add_argument("action", nargs="?", choices=["clean"], help="remove the capture instead of installing it")
    p.add_argument("-p", "--envoy-port", default="15001", help="port outbound TCP is redirected to")
    p.add_argument("-z", "--inbound-capture-port", default="15006", help="port inbound TCP is redirected to")
    p.add_argument("-e", "--inbound-tunnel-port", default="15008", help="HBONE tunnel port, never captured")
    p.add_argument("-u", "--proxy-uid", default="1337", help="proxy uid(s), never captured")
    p.add_argument("-g", "--proxy-gid", default=None, help="gid(s) of the proxy (default: the -u value)")
    p.add_argument("-m", "--istio-inbound-interception-mode", dest="mode", default="REDIRECT")
    p.add_argument("-b", "--istio-inbound-ports", dest="inbound_ports", default="", help="ports or '*'")
    p.add_argument("-d", "--istio-local-exclude-ports", dest="inbound_exclude", default="")
    p.add_argument("-c", "--istio-exclude-interfaces", dest="exclude_interfaces", default="")
    p.add_argument("-i", "--istio-service-cidr", dest="include_cidrs", default="", help="CIDRs or '*'")
    p.add_argument("-x", "--istio-service-exclude-cidr", dest="exclude_cidrs", default="")
    p.add_argument("-q", "--istio-outbound-ports", dest="outbound_ports", default="")
    p.add_argument("-o", "--istio-local-outbound-ports-exclude", dest="outbound_exclude", default="")
    p.add_argument("-k", "--kube-virt-interfaces", dest="reroute_interfaces", default="")
    p.add_argument("-t", "--istio-inbound-tproxy-mark", dest="tproxy_mark", default="1337")
    p.add_argument("-r", "--istio-inbound-tproxy-route-table", dest="tproxy_table", default="133")
    p.add_argument("-n", "--dry-run", action="store_true", help="print what would be applied, change nothing")
    p.add_argument("--cleanup-only", action="store_true", help="same as the `clean` action")
    p.add_argument("--ipv6", "--dual-stack", dest="ipv6", action="store_true", help="also program ip6tables")
    # The injector passes istio's logging flag; accepted so its argv works unchanged.
    p.add_argument("--log_output_level", default="", help=argparse.SUPPRESS)
    return p


def config_from(args: argparse.Namespace) -> CaptureConfig:
    return CaptureConfig(
        proxy_port=args.envoy_port,
        inbound_capture_port=args.inbound_capture_port,
        inbound_tunnel_port=args.inbound_tunnel_port,
        proxy_uid=args.proxy_uid,
        proxy_gid=args.proxy_uid if args.proxy_gid is None else args.proxy_gid,
        mode=args.mode,
        inbound_ports_include=args.inbound_ports,
        inbound_ports_exclude=args.inbound_exclude,
        outbound_ranges_include=args.include_cidrs,
        outbound_ranges_exclude=args.exclude_cidrs,
        outbound_ports_include=args.outbound_ports,
        outbound_ports_exclude=args.outbound_exclude,
        reroute_interfaces=args.reroute_interfaces,
        exclude_interfaces=args.exclude_interfaces,
        tproxy_mark=args.tproxy_mark,
        tproxy_route_table=args.tproxy_table,
        ipv6=args.ipv6,
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        cfg = config_from(args)
    except ValueError as err:
        print(f"meshpilot iptables: {err}", file=sys.stderr)
        return 2
    if args.action == "clean" or args.cleanup_only:
        if args.dry_run:
            sys.stdout.write("".join(" ".join(a) + "\n" for a in runner.cleanup_plan(cfg)))
        else:
            runner.cleanup(cfg)
        return 0
    plan = runner.plan(cfg)
    if args.dry_run:
        sys.stdout.write(plan.describe())
        return 0
    try:
        runner.apply(plan)
    except (runner.CaptureError, OSError) as err:
        print(f"meshpilot iptables: {err}", file=sys.stderr)
        return 1
    return 0
