"""Undoing a capture: the commands istio-iptables' `clean` runs, as pure data.

Cleanup is given the same flags as the install, so it knows which rules it added to the
built-in chains; each is deleted on its own and a missing one is not an error, because a
half-applied or already-cleaned namespace must still end up clean.
"""

from __future__ import annotations

from meshpilot.iptables.config import CaptureConfig
from meshpilot.iptables.rules import BUILTIN_CHAINS, Rule, build_rules, declared_chains, render_restore


def _undo(rules: tuple[Rule, ...]) -> list[list[str]]:
    commands: list[list[str]] = []
    for rule in rules:
        if rule.chain in BUILTIN_CHAINS:
            commands.append(["-t", rule.table, "-D", rule.chain, *rule.params])
    # Jumps from built-in chains are gone by now. Every chain is emptied before any is
    # removed, because ISTIO chains jump to each other and -X refuses a referenced chain.
    declared = declared_chains(render_restore(rules))
    for op in ("-F", "-X"):
        for table, chains in declared.items():
            commands.extend(["-t", table, op, chain] for chain in chains)
    return commands


def cleanup_commands(cfg: CaptureConfig) -> tuple[list[list[str]], list[list[str]]]:
    """iptables and ip6tables argument lists (without the binary) that remove the capture."""
    rules = build_rules(cfg)
    return _undo(rules.v4), (_undo(rules.v6) if cfg.ipv6 else [])


def route_commands(cfg: CaptureConfig, *, add: bool) -> list[list[str]]:
    """`ip` argument lists for TPROXY's policy routing: marked packets are delivered on lo."""
    if cfg.mode != "TPROXY" or not cfg.inbound_ports_include:
        return []
    families = ["-4"] + (["-6"] if cfg.ipv6 else [])
    table = cfg.tproxy_route_table
    commands: list[list[str]] = []
    for fam in families:
        if add:
            commands.append([fam, "rule", "add", "fwmark", cfg.tproxy_mark, "lookup", table])
            dest = "0.0.0.0/0" if fam == "-4" else "::/0"
            commands.append([fam, "route", "add", "local", dest, "dev", "lo", "table", table])
        else:
            commands.append([fam, "rule", "del", "fwmark", cfg.tproxy_mark, "lookup", table])
            commands.append([fam, "route", "flush", "table", table])
    return commands
