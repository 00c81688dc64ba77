"""istio-iptables' capture rules, in istio's order, rendered as `iptables-restore` input.

Pure functions: the same config always gives the same text, for IPv4 and (when asked)
IPv6, so dry runs and golden tests see exactly what the runner applies.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from meshpilot.iptables.config import CaptureConfig, NetworkRange, split_families, split_list

ISTIO_INBOUND = "ISTIO_INBOUND"
ISTIO_REDIRECT = "ISTIO_REDIRECT"
ISTIO_IN_REDIRECT = "ISTIO_IN_REDIRECT"
ISTIO_OUTPUT = "ISTIO_OUTPUT"
ISTIO_DIVERT = "ISTIO_DIVERT"
ISTIO_TPROXY = "ISTIO_TPROXY"

# Marks packets Envoy sends to the app over lo in TPROXY mode (istio's OutboundMark).
OUTBOUND_MARK = "1338"

# Chains and targets iptables provides; never declared with -N.
BUILTIN_CHAINS = frozenset(
    {
        "PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING",
        "ACCEPT", "DROP", "RETURN", "REDIRECT", "MARK", "TPROXY", "CONNMARK", "CT", "REJECT", "LOG",
    }
)  # fmt: skip

# Stands in for the family's own loopback address inside a rule shared by both families.
_LOOPBACK = "\0loopback"
_PASSTHROUGH = "\0passthrough"


@dataclass(frozen=True)
class Rule:
    """One `-A` (or `-I` at `position`) line in `table`."""

    table: str
    chain: str
    params: tuple[str, ...]
    position: int | None = None

    def line(self) -> str:
        head = f"-A {self.chain}" if self.position is None else f"-I {self.chain} {self.position}"
        return " ".join((head, *self.params))


class _Rules:
    """Collects rules for both families in call order, as istio's rule builder does."""

    def __init__(self, host_loopback_v4: str) -> None:
        self.v4: list[Rule] = []
        self.v6: list[Rule] = []
        self._loopback = {4: host_loopback_v4, 6: "::1/128"}
        self._passthrough = {4: "127.0.0.6/32", 6: "::6/128"}

    def _make(self, family: int, table: str, chain: str, params: Sequence[str], position: int | None) -> Rule:
        swap = {_LOOPBACK: self._loopback[family], _PASSTHROUGH: self._passthrough[family]}
        return Rule(table, chain, tuple(swap.get(p, p) for p in params), position)

    def append(self, chain: str, table: str, *params: str) -> None:
        self.v4.append(self._make(4, table, chain, params, None))
        self.v6.append(self._make(6, table, chain, params, None))

    def insert(self, chain: str, table: str, position: int, *params: str) -> None:
        self.v4.append(self._make(4, table, chain, params, position))
        self.v6.append(self._make(6, table, chain, params, position))

    def append_v4(self, chain: str, table: str, *params: str) -> None:
        self.v4.append(self._make(4, table, chain, params, None))

    def append_v6(self, chain: str, table: str, *params: str) -> None:
        self.v6.append(self._make(6, table, chain, params, None))

    def insert_v4(self, chain: str, table: str, position: int, *params: str) -> None:
        self.v4.append(self._make(4, table, chain, params, position))

    def insert_v6(self, chain: str, table: str, position: int, *params: str) -> None:
        self.v6.append(self._make(6, table, chain, params, position))


@dataclass(frozen=True)
class RuleSet:
    v4: tuple[Rule, ...]
    v6: tuple[Rule, ...]


def build_rules(cfg: CaptureConfig) -> RuleSet:
    """All capture rules for `cfg`, in the order istio-iptables emits them."""
    rb = _Rules(cfg.host_loopback_v4)
    v4_exclude, v6_exclude = split_families(cfg.outbound_ranges_exclude)
    v4_include, v6_include = split_families(cfg.outbound_ranges_include)
    tproxy = cfg.mode == "TPROXY"

    for nic in split_list(cfg.exclude_interfaces):
        rb.append("PREROUTING", "nat", "-i", nic, "-j", "RETURN")
        rb.append("OUTPUT", "nat", "-o", nic, "-j", "RETURN")
    if tproxy:
        for nic in split_list(cfg.exclude_interfaces):
            rb.append("PREROUTING", "mangle", "-i", nic, "-j", "RETURN")
            rb.append("OUTPUT", "mangle", "-o", nic, "-j", "RETURN")
    for nic in split_list(cfg.reroute_interfaces):
        rb.insert("PREROUTING", "nat", 1, "-i", nic, "-j", "RETURN")

    # The HBONE tunnel port is never captured; the two redirect chains do the capturing.
    rb.append(ISTIO_INBOUND, "nat", "-p", "tcp", "--dport", cfg.inbound_tunnel_port, "-j", "RETURN")
    rb.append(ISTIO_REDIRECT, "nat", "-p", "tcp", "-j", "REDIRECT", "--to-ports", cfg.proxy_port)
    rb.append(ISTIO_IN_REDIRECT, "nat", "-p", "tcp", "-j", "REDIRECT", "--to-ports", cfg.inbound_capture_port)

    _inbound(rb, cfg)

    rb.append("OUTPUT", "nat", "-j", ISTIO_OUTPUT)
    # Port exclusions come before the loopback rules so they win over app-to-self capture.
    for port in split_list(cfg.outbound_ports_exclude):
        rb.append(ISTIO_OUTPUT, "nat", "-p", "tcp", "--dport", port, "-j", "RETURN")
        rb.append(ISTIO_OUTPUT, "nat", "-p", "udp", "--dport", port, "-j", "RETURN")
    # Envoy's inbound passthrough connects from 127.0.0.6; those must reach the app untouched.
    rb.append(ISTIO_OUTPUT, "nat", "-o", "lo", "-s", _PASSTHROUGH, "-j", "RETURN")

    keep_lo_shortcut = not v4_include.has_loopback and not v6_include.has_loopback
    for kind, ids in (("--uid-owner", cfg.proxy_uid), ("--gid-owner", cfg.proxy_gid)):
        for owner in split_list(ids):
            # Envoy calling a VIP that resolves to this pod goes back through Envoy's inbound side.
            rb.append(
                ISTIO_OUTPUT, "nat", "-o", "lo", "!", "-d", _LOOPBACK, "-p", "tcp",
                "!", "--dport", cfg.inbound_tunnel_port, "-m", "owner", kind, owner, "-j", ISTIO_IN_REDIRECT,
            )  # fmt: skip
            if keep_lo_shortcut:
                # The app reaching itself over lo by pod IP is not mesh traffic.
                rb.append(ISTIO_OUTPUT, "nat", "-o", "lo", "-m", "owner", "!", kind, owner, "-j", "RETURN")
            # Envoy's own outbound traffic must never loop back into Envoy.
            rb.append(ISTIO_OUTPUT, "nat", "-m", "owner", kind, owner, "-j", "RETURN")

    rb.append(ISTIO_OUTPUT, "nat", "-d", _LOOPBACK, "-j", "RETURN")
    # Exclusions must precede inclusions: the first matching rule wins.
    for cidr in v4_exclude.cidrs:
        rb.append_v4(ISTIO_OUTPUT, "nat", "-d", str(cidr), "-j", "RETURN")
    for cidr in v6_exclude.cidrs:
        rb.append_v6(ISTIO_OUTPUT, "nat", "-d", str(cidr), "-j", "RETURN")
    for port in split_list(cfg.outbound_ports_include):
        rb.append(ISTIO_OUTPUT, "nat", "-p", "tcp", "--dport", port, "-j", ISTIO_REDIRECT)
    _outbound_include(cfg, v4_include, rb.append_v4, rb.insert_v4)
    _outbound_include(cfg, v6_include, rb.append_v6, rb.insert_v6)

    if tproxy:
        _tproxy_marks(rb, cfg)
    return RuleSet(tuple(rb.v4), tuple(rb.v6))


def _inbound(rb: _Rules, cfg: CaptureConfig) -> None:
    if not cfg.inbound_ports_include:
        return
    tproxy = cfg.mode == "TPROXY"
    table = "mangle" if tproxy else "nat"
    if tproxy:
        # Marked packets are routed to lo (ip rule fwmark -> local route table) where TPROXY
        # hands them to Envoy's inbound listener with the original destination intact.
        rb.append(ISTIO_DIVERT, "mangle", "-j", "MARK", "--set-mark", cfg.tproxy_mark)
        rb.append(ISTIO_DIVERT, "mangle", "-j", "ACCEPT")
        rb.append(
            ISTIO_TPROXY, "mangle", "!", "-d", _LOOPBACK, "-p", "tcp", "-j", "TPROXY",
            "--tproxy-mark", f"{cfg.tproxy_mark}/0xffffffff", "--on-port", cfg.inbound_capture_port,
        )  # fmt: skip
    rb.append("PREROUTING", table, "-p", "tcp", "-j", ISTIO_INBOUND)
    if cfg.inbound_ports_include.strip() == "*":
        for port in split_list(cfg.inbound_ports_exclude):
            rb.append(ISTIO_INBOUND, table, "-p", "tcp", "--dport", port, "-j", "RETURN")
        if tproxy:
            established = ("-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED", "-j", ISTIO_DIVERT)
            rb.append(ISTIO_INBOUND, "mangle", "-p", "tcp", *established)
            rb.append(ISTIO_INBOUND, "mangle", "-p", "tcp", "-j", ISTIO_TPROXY)
        else:
            rb.append(ISTIO_INBOUND, "nat", "-p", "tcp", "-j", ISTIO_IN_REDIRECT)
        return
    for port in split_list(cfg.inbound_ports_include):
        if tproxy:
            rb.append(
                ISTIO_INBOUND, "mangle", "-p", "tcp", "--dport", port,
                "-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED", "-j", ISTIO_DIVERT,
            )  # fmt: skip
            rb.append(ISTIO_INBOUND, "mangle", "-p", "tcp", "--dport", port, "-j", ISTIO_TPROXY)
        else:
            rb.append(ISTIO_INBOUND, "nat", "-p", "tcp", "--dport", port, "-j", ISTIO_IN_REDIRECT)


def _outbound_include(
    cfg: CaptureConfig,
    include: NetworkRange,
    append: Callable[..., None],
    insert: Callable[..., None],
) -> None:
    nics = split_list(cfg.reroute_interfaces)
    if include.wildcard:
        append(ISTIO_OUTPUT, "nat", "-j", ISTIO_REDIRECT)
        for nic in nics:
            insert("PREROUTING", "nat", 1, "-i", nic, "-j", ISTIO_REDIRECT)
        return
    for cidr in include.cidrs:
        for nic in nics:
            insert("PREROUTING", "nat", 1, "-i", nic, "-d", str(cidr), "-j", ISTIO_REDIRECT)
        append(ISTIO_OUTPUT, "nat", "-d", str(cidr), "-j", ISTIO_REDIRECT)


def _tproxy_marks(rb: _Rules, cfg: CaptureConfig) -> None:
    mark = cfg.tproxy_mark
    # Keep the mark set by Envoy's original_src on the connection, and restore it on replies.
    save, restore = ("-j", "CONNMARK", "--save-mark"), ("-j", "CONNMARK", "--restore-mark")
    rb.append("PREROUTING", "mangle", "-p", "tcp", "-m", "mark", "--mark", mark, *save)
    rb.append("OUTPUT", "mangle", "-p", "tcp", "-o", "lo", "-m", "mark", "--mark", mark, "-j", "RETURN")
    for kind, ids in (("--uid-owner", cfg.proxy_uid), ("--gid-owner", cfg.proxy_gid)):
        for owner in split_list(ids):
            rb.append(
                "OUTPUT", "mangle", "!", "-d", _LOOPBACK, "-p", "tcp", "-o", "lo",
                "-m", "owner", kind, owner, "-j", "MARK", "--set-mark", OUTBOUND_MARK,
            )  # fmt: skip
    rb.append("OUTPUT", "mangle", "-p", "tcp", "-m", "connmark", "--mark", mark, *restore)
    # Inserted at the top so already-diverted, passthrough and app-to-self packets skip TPROXY.
    rb.insert(ISTIO_INBOUND, "mangle", 1, "-p", "tcp", "-m", "mark", "--mark", mark, "-j", "RETURN")
    rb.insert_v4(ISTIO_INBOUND, "mangle", 2, "-p", "tcp", "-s", "127.0.0.6/32", "-i", "lo", "-j", "RETURN")
    rb.insert_v6(ISTIO_INBOUND, "mangle", 2, "-p", "tcp", "-s", "::6/128", "-i", "lo", "-j", "RETURN")
    not_outbound = ("-m", "mark", "!", "--mark", OUTBOUND_MARK)
    rb.insert(ISTIO_INBOUND, "mangle", 3, "-p", "tcp", "-i", "lo", *not_outbound, "-j", "RETURN")


def render_restore(rules: Sequence[Rule]) -> str:
    """`iptables-restore --noflush` input: per table (sorted), new chains then rules in order."""
    declared: dict[str, list[str]] = {}
    lines: dict[str, list[str]] = {}
    seen: set[tuple[str, str]] = set()

    def declare(table: str, chain: str) -> None:
        if (table, chain) not in seen:
            seen.add((table, chain))
            if chain not in BUILTIN_CHAINS:
                declared.setdefault(table, []).append(f"-N {chain}")

    for rule in rules:
        declare(rule.table, rule.chain)
    # Chains that are only jumped to still have to exist.
    for rule in rules:
        if len(rule.params) >= 2 and rule.params[-2] == "-j":
            declare(rule.table, rule.params[-1])
    for rule in rules:
        lines.setdefault(rule.table, []).append(rule.line())
    out: list[str] = []
    for table in sorted(lines):
        out.append(f"* {table}")
        out.extend(declared.get(table, []))
        out.extend(lines[table])
        out.append("COMMIT")
    return "".join(line + "\n" for line in out)


def declared_chains(restore: str) -> dict[str, list[str]]:
    """Table -> chains a restore input creates with -N."""
    chains: dict[str, list[str]] = {}
    table = ""
    for line in restore.splitlines():
        if line.startswith("*"):
            table = line[1:].strip()
        elif line.startswith("-N "):
            chains.setdefault(table, []).append(line[3:].strip())
    return chains
