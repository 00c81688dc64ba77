"""``meshpilot preview -f CHANGE.yaml``: ask a running server what applying a change would push.

The change is sent to the server's ``POST /debug/preview`` (the monitoring port, 15014 by default)
and the answer printed for people: the objects and what they do, validation errors (exit 1), the
proxies that would be pushed with the resources that would change, appear or disappear, and the
diff of each changed resource. ``--json`` prints the server's answer as it is.
"""

from __future__ import annotations

import argparse
import sys
import urllib.parse
from pathlib import Path
from typing import Any, TextIO

import orjson

from meshpilot.cli.debug_http import DEFAULT_SERVER, ask


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "preview",
        help="show what a config change would push, before applying it",
        description="Send the objects of the given files to a running meshpilot (POST /debug/preview) and "
        "print which proxies would be pushed, which of their resources would change, and how.",
    )
    p.add_argument("-f", "--filename", dest="files", type=Path, action="extend", nargs="+", required=True)
    p.add_argument("--server", default=DEFAULT_SERVER, help=f"the server's debug address ({DEFAULT_SERVER})")
    p.add_argument("--delete", action="store_true", help="preview deleting the objects named instead")
    p.add_argument("-n", "--namespace", default="default", help="namespace of objects that name none")
    p.add_argument("--json", action="store_true", help="print the server's JSON answer")
    p.add_argument("--no-diff", action="store_true", help="leave the diffs out")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for the answer")
    p.set_defaults(run=lambda args: run(args, sys.stdout, sys.stderr))


def run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    try:
        body = b"\n---\n".join(path.read_bytes() for path in args.files)
    except OSError as e:
        print(f"cannot read the change: {e}", file=err)
        return 2
    query = urllib.parse.urlencode(
        {"namespace": args.namespace, **({"delete": "true"} if args.delete else {})}
    )
    url = f"{args.server.rstrip('/')}/debug/preview?{query}"
    answer = ask(url, err, body=body, timeout=args.timeout)
    if answer is None:
        return 2
    if args.json:
        out.write(answer.decode() + "\n")
        result = orjson.loads(answer)
        return 0 if result.get("valid") else 1
    return show(orjson.loads(answer), out, diffs=not args.no_diff)


def show(result: dict[str, Any], out: TextIO, *, diffs: bool = True) -> int:
    """The answer for people; 1 when the change is invalid."""
    for obj in result.get("objects", ()):
        print(f"{obj['change']:<9} {obj['kind']} {obj['namespace']}/{obj['name']}", file=out)
    for warning in result.get("warnings", ()):
        print(f"warning: {warning}", file=out)
    if not result.get("valid"):
        for error in result.get("errors", ()):
            print(f"error: {error}", file=out)
        print("the change is invalid: nothing would be applied", file=out)
        return 1
    counts = result.get("proxies", {})
    print(
        f"{counts.get('pushed', 0)} of {counts.get('considered', 0)} connected proxies would be pushed "
        f"({counts.get('inScope', 0)} in scope; {result['timing']['seconds']}s to work out)",
        file=out,
    )
    shown: set[str] = set()
    for push in result.get("pushes", ()):
        print(f"\n{push['proxy']} ({push['protocol']}): {', '.join(push['types'])}", file=out)
        for res in push["resources"]:
            print(f"  {res['change']:<8} {res['type']} {res['name']}", file=out)
        for short in push.get("reordered", ()):
            print(f"  reordered {short} (a state-of-the-world stream resends it)", file=out)
        for name in push.get("warming", ()):
            print(f"  resent   eds {name} (its cluster changed: Envoy warms it)", file=out)
        if diffs:
            for res in push["resources"]:
                key = res.get("diff")
                if key and key not in shown:
                    shown.add(key)
                    out.write("\n" + result["diffs"][key])
    for other in result.get("unscoped", ()):
        changed = ", ".join(f"{r['type']} {r['name']}" for r in other["resources"])
        print(f"\nnot pushed although its config would change: {other['proxy']}: {changed}", file=out)
    return 0
