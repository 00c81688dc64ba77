"""`meshpilot iptables` without --dry-run, for real, inside a throwaway network namespace."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest
from support.netns import NetworkNamespace

pytestmark = pytest.mark.integration

TPROXY_FLAGS = ["-m", "TPROXY", "-b", "*", "-d", "15020", "-i", "*", "--ipv6"]


@pytest.fixture
def ns() -> Iterator[NetworkNamespace]:
    namespace = NetworkNamespace("mp-ipt")
    try:
        yield namespace.create()
    finally:
        namespace.delete()


def _meshpilot(ns: NetworkNamespace, *args: str, check: bool = True) -> tuple[int, str]:
    done = ns.run([sys.executable, "-m", "meshpilot.cli.main", "iptables", *args], check=check)
    return done.returncode, done.stderr


def test_tproxy_dual_stack_applies_routes_and_cleans_up(ns: NetworkNamespace) -> None:
    _meshpilot(ns, *TPROXY_FLAGS)
    for tool in ("iptables-save", "ip6tables-save"):
        saved = ns.run([tool]).stdout
        for chain in ("ISTIO_DIVERT", "ISTIO_TPROXY", "ISTIO_INBOUND", "ISTIO_OUTPUT", "ISTIO_REDIRECT"):
            assert f":{chain} " in saved, (tool, chain)
        # The kernel accepted the TPROXY target itself (1337 = 0x539), not only the chains.
        assert "--on-port 15006" in saved and "0x539" in saved
    # Policy routing: marked packets are delivered locally on lo, in both families.
    assert "fwmark 0x539 lookup 133" in ns.run(["ip", "-4", "rule"]).stdout
    assert "fwmark 0x539 lookup 133" in ns.run(["ip", "-6", "rule"]).stdout
    assert "local default dev lo" in ns.run(["ip", "-4", "route", "show", "table", "133"]).stdout

    # A second install would append duplicate rules; it is refused with a pointer to `clean`.
    code, err = _meshpilot(ns, *TPROXY_FLAGS, check=False)
    assert code == 1 and "clean" in err

    _meshpilot(ns, "clean", *TPROXY_FLAGS)
    assert "ISTIO" not in ns.run(["iptables-save"]).stdout
    assert "ISTIO" not in ns.run(["ip6tables-save"]).stdout
    assert "fwmark" not in ns.run(["ip", "-4", "rule"]).stdout
    assert ns.run(["ip", "-4", "route", "show", "table", "133"]).stdout.strip() == ""


def test_clean_on_a_clean_namespace_is_harmless(ns: NetworkNamespace) -> None:
    # Cleanup is best effort: nothing installed is not an error.
    _meshpilot(ns, "clean", "-i", "*", "-b", "*")
    assert "ISTIO" not in ns.run(["iptables-save"]).stdout
