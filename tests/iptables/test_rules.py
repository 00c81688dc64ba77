"""`meshpilot iptables --dry-run` against golden rule text.

The first fifteen cases use the flag sets of istio-iptables' own golden tests
(tools/istio-iptables/pkg/capture/testdata); their rules (IPv4, and IPv6 for the ipv6-*
cases) were checked line by line against istio's goldens when these files were written.
The rest cover the injector's argv, exclusions, IPv6, TPROXY routes and cleanup.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from meshpilot.cli.main import main
from meshpilot.iptables.config import CaptureConfig
from meshpilot.iptables.rules import build_rules

GOLDEN = Path(__file__).parent / "golden"

CASES: dict[str, list[str]] = {
    "empty": [],
    "inbound-ports-wildcard": ["-b", "*"],
    "inbound-ports-include": ["-b", "32000,31000"],
    "ipnets": ["-i", "10.0.0.0/8"],
    "outbound-ports-include": ["-q", "32000,31000"],
    "basic-exclude-nic": ["-c", "not-istio-nic"],
    "inbound-ports-tproxy": ["-b", "32000,31000", "-m", "TPROXY"],
    "inbound-ports-wildcard-tproxy": ["-b", "*", "-m", "TPROXY"],
    "kube-virt-interfaces": ["-k", "eth1,eth2", "-i", "*"],
    "ipnets-with-kube-virt-interfaces": ["-k", "eth1,eth2", "-i", "10.0.0.0/8"],
    # istio's dual-stack cases: both families' rules were checked against its goldens.
    "ipv6-inbound-ports": ["-b", "4000,5000", "--ipv6"],
    "ipv6-virt-interfaces": ["-b", "4000,5000", "-k", "eth0,eth1", "--ipv6"],
    "ipv6-ipnets": [
        "-b", "4000,5000", "-d", "6000,7000,", "-k", "eth0,eth1",
        "-x", "2001:db8::/32", "-i", "2001:db8::/32", "--ipv6",
    ],
    "ipv6-uid-gid": [
        "-b", "4000,5000", "-d", "6000,7000", "-k", "eth0,eth1", "-g", "1,2", "-u", "3,4",
        "-x", "2001:db8::/32", "-i", "2001:db8::/32", "--ipv6",
    ],
    "ipv6-outbound-ports": ["-q", "32000,31000", "--ipv6"],
    # The argv the sidecar injector gives istio-init.
    "sidecar-injector-defaults": [
        "-p", "15001", "-z", "15006", "-u", "1337", "-m", "REDIRECT", "-i", "*", "-x", "",
        "-b", "*", "-d", "15090,15021,15020", "--log_output_level=default:info",
    ],
    "exclusions": [
        "-i", "*", "-x", "10.96.0.0/12,192.168.0.0/16,fd00::/8", "-b", "*", "-d", "15090,15021",
        "-o", "3306,9000", "--ipv6",
    ],
    "include-cidrs-and-ports": [
        "-i", "10.96.0.0/12,fd00:10:96::/112", "-q", "8443", "-u", "1337,1338", "-g", "1337", "--ipv6",
    ],
    "tproxy-dual-stack": ["-m", "TPROXY", "-b", "*", "-d", "15020", "-i", "*", "--ipv6"],
    "cleanup-redirect": ["clean", "-i", "*", "-b", "*", "-d", "15090"],
    "cleanup-tproxy": ["clean", "-m", "TPROXY", "-b", "*", "-i", "*"],
}  # fmt: skip


def _dry_run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(["iptables", *argv, "--dry-run"]) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("name", sorted(CASES))
def test_dry_run_matches_golden(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    out = _dry_run(CASES[name], capsys)
    path = GOLDEN / f"{name}.txt"
    if os.environ.get("UPDATE_GOLDEN") == "1":
        path.write_text(out)
    assert out == path.read_text()


def test_loopback_include_drops_the_app_to_self_shortcut() -> None:
    # Including a loopback range asks for app->lo traffic to reach Envoy, as istio does.
    rules = build_rules(CaptureConfig(outbound_ranges_include="127.1.2.3/32"))
    lines = [r.line() for r in rules.v4]
    assert "-A ISTIO_OUTPUT -d 127.1.2.3/32 -j ISTIO_REDIRECT" in lines
    assert not any("! --uid-owner" in line for line in lines)


def test_exclude_everything_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["iptables", "-x", "*", "--dry-run"]) == 2
    assert "'*'" in capsys.readouterr().err


def test_unknown_mode_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["iptables", "-m", "TUNNEL", "--dry-run"]) == 2
    assert "REDIRECT or TPROXY" in capsys.readouterr().err
