"""``meshpilot explain --proxy ID``: why a proxy got its last pushes, asked of a running server.

Reads ``/debug/explain`` on the server's debug port and prints the Gateways that select the proxy (for
a gateway), then, per push, what set it off, why each change concerned the proxy, and what was sent.
``--resource TYPE/NAME`` prints instead the Istio objects behind one resource the proxy holds.
``--json`` prints the server's answer as it is.
"""

from __future__ import annotations

import argparse
import sys
import urllib.parse
from typing import Any, TextIO

import orjson

from meshpilot.cli.debug_http import DEFAULT_SERVER, ask


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "explain",
        help="say why a proxy got its last pushes, or which objects made one of its resources",
        description="Ask a running meshpilot (GET /debug/explain) why a proxy got each of its last pushes, "
        "or, with --resource, which Istio objects produced one resource it holds.",
    )
    p.add_argument("--proxy", required=True, help="the proxy (a part of its ID, e.g. pod.namespace)")
    p.add_argument(
        "--resource",
        default="",
        help="TYPE/NAME, e.g. cds/outbound|9080||reviews.default.svc... or rds/http.8080",
    )
    p.add_argument("--server", default=DEFAULT_SERVER, help=f"the server's debug address ({DEFAULT_SERVER})")
    p.add_argument("--limit", type=int, default=10, help="pushes to show (at most 10)")
    p.add_argument("--json", action="store_true", help="print the server's JSON answer")
    p.set_defaults(run=lambda args: run(args, sys.stdout, sys.stderr))


def run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    query = {"proxyID": args.proxy, "limit": str(args.limit)}
    if args.resource:
        query["resource"] = args.resource
    url = f"{args.server.rstrip('/')}/debug/explain?{urllib.parse.urlencode(query)}"
    answer = ask(url, err)
    if answer is None:
        return 2
    if args.json:
        out.write(answer.decode() + "\n")
        return 0
    data = orjson.loads(answer)
    if args.resource:
        out.write(orjson.dumps(data, option=orjson.OPT_INDENT_2).decode() + "\n")
        return 0
    show(data, out)
    return 0


def show(data: dict[str, Any], out: TextIO) -> None:
    state = "connected" if data.get("connected") else "not connected"
    print(f"{data['proxy']} ({state}; {data.get('scope', 'no scope')})", file=out)
    for gateway in data.get("gateways", ()):
        selector = ", ".join(f"{k}={v}" for k, v in sorted(gateway["selector"].items())) or "every gateway"
        ports = ", ".join(str(p) for p in gateway["ports"])
        print(f"selected by Gateway {gateway['name']} ({selector}; ports {ports})", file=out)
    if not data["pushes"]:
        print("no pushes recorded", file=out)
    for push in data["pushes"]:
        kind = "full" if push["full"] else "endpoints only"
        name = push.get("label", push["push"])  # a server before labels sends the number only
        print(
            f"\npush {name} at {push['started']} ({kind}, {push['merged']} events merged): "
            f"{push['trigger']}; {push['bytes']} bytes in {push['seconds']}s",
            file=out,
        )
        for change in push["changes"]:
            why = f": {change['why']}" if "why" in change else ""
            print(
                f"  {change['change']} {change['kind']} {change['namespace']}/{change['name']}{why}", file=out
            )
        if push["changesNotListed"]:
            print(f"  and {push['changesNotListed']} more changes", file=out)
        for sent in push["sent"]:
            names = ", ".join(sent["names"][:5]) + (" ..." if sent["count"] > 5 else "")
            removed = f"; removed {', '.join(sent['removed'])}" if sent.get("removed") else ""
            print(
                f"  sent {sent['type']} ({sent['count']}, {sent['bytes']} bytes): {names}{removed}", file=out
            )
