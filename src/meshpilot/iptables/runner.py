"""Applies capture rules with the real iptables tools and checks the result."""

from __future__ import annotations

import re
import shlex
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field

from meshpilot.iptables.cleanup import cleanup_commands, route_commands
from meshpilot.iptables.config import CaptureConfig
from meshpilot.iptables.rules import build_rules, declared_chains, render_restore

# Bounds each tool call: iptables waits on the xtables lock, which must never hang a pod's init.
_TIMEOUT = 30.0


class CaptureError(RuntimeError):
    pass


@dataclass
class Plan:
    """What a run does: restore inputs per family, then routes; printed as is on a dry run."""

    v4: str
    v6: str | None
    routes: list[list[str]] = field(default_factory=list)

    def describe(self) -> str:
        parts = ["iptables-restore --noflush <<EOF\n" + self.v4 + "EOF\n"]
        if self.v6 is not None:
            parts.append("ip6tables-restore --noflush <<EOF\n" + self.v6 + "EOF\n")
        parts.extend(shlex.join(["ip", *r]) + "\n" for r in self.routes)
        return "".join(parts)


def plan(cfg: CaptureConfig) -> Plan:
    rules = build_rules(cfg)
    v6 = render_restore(rules.v6) if cfg.ipv6 else None
    return Plan(render_restore(rules.v4), v6, route_commands(cfg, add=True))


def _run(argv: Sequence[str], stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        list(argv), input=stdin, capture_output=True, text=True, timeout=_TIMEOUT, check=False
    )


def saved_chains(save: str) -> dict[str, set[str]]:
    """Table -> chains that `iptables-save` output lists."""
    chains: dict[str, set[str]] = {}
    table = ""
    for line in save.splitlines():
        if line.startswith("*"):
            table = line[1:].strip()
        elif match := re.match(r":(\S+) ", line):
            chains.setdefault(table, set()).add(match.group(1))
    return chains


def _saved(tool: str) -> dict[str, set[str]]:
    """Table -> chains present now, as ``<tool>-save`` lists them."""
    saved = _run([f"{tool}-save"])
    if saved.returncode != 0:
        raise CaptureError(f"{tool}-save failed: {saved.stderr.strip()}")
    return saved_chains(saved.stdout)


def _apply_family(restore: str, tool: str) -> None:
    declared = [(table, chain) for table, chains in declared_chains(restore).items() for chain in chains]
    before = _saved(tool)
    if clash := [f"{t}/{c}" for t, c in declared if c in before.get(t, set())]:
        # Appending to chains from an earlier run would duplicate every rule; istio also
        # wants a clean slate, so say how to get one.
        raise CaptureError(f"chains {', '.join(clash)} already exist; run `meshpilot iptables clean` first")
    done = _run([f"{tool}-restore", "--noflush"], restore)
    if done.returncode != 0:
        raise CaptureError(f"{tool}-restore failed: {done.stderr.strip()}")
    after = _saved(tool)
    if missing := [f"{t}/{c}" for t, c in declared if c not in after.get(t, set())]:
        raise CaptureError(f"{tool}-save does not show chains {', '.join(missing)} after restore")


def apply(p: Plan) -> None:
    """Installs the rules (and TPROXY routes), then verifies the chains exist."""
    _apply_family(p.v4, "iptables")
    if p.v6 is not None:
        _apply_family(p.v6, "ip6tables")
    for route in p.routes:
        done = _run(["ip", *route])
        if done.returncode != 0 and "File exists" not in done.stderr:
            raise CaptureError(f"ip {shlex.join(route)} failed: {done.stderr.strip()}")


def cleanup_plan(cfg: CaptureConfig) -> list[list[str]]:
    """Full argv lists, in order, that undo `cfg`'s capture."""
    v4, v6 = cleanup_commands(cfg)
    argvs = [["iptables", *c] for c in v4] + [["ip6tables", *c] for c in v6]
    return argvs + [["ip", *r] for r in route_commands(cfg, add=False)]


def cleanup(cfg: CaptureConfig) -> None:
    # Best effort by design: each command may find its rule or chain already gone.
    for argv in cleanup_plan(cfg):
        _run(argv)
