"""``meshpilot validate``: a real subprocess, its exit code and what it prints."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from meshpilot.cli.main import build_parser
from meshpilot.server.settings import Address

VALID = """\
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: reviews, namespace: bookinfo}
spec:
  hosts: [reviews]
  http:
  - route:
    - destination: {host: reviews, subset: v1}
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: reviews, namespace: bookinfo}
spec:
  host: reviews
  subsets:
  - {name: v1, labels: {version: v1}}
"""

INVALID = """\
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: ok, namespace: bookinfo}
spec:
  hosts: [ratings]
  tcp:
  - route:
    - destination: {host: ratings}
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: negative, namespace: bookinfo}
spec:
  hosts: [reviews]
  http:
  - route:
    - destination: {host: reviews}
      weight: -5
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: deny-all, namespace: bookinfo}
spec:
  action: NOPE
"""

WARNING = """\
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: mirrored, namespace: bookinfo}
spec:
  hosts: [reviews]
  http:
  - route:
    - destination: {host: reviews}
    mirror: {host: shadow}
    mirrorPercent: 50
"""


def run(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "meshpilot.cli.main", "validate", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_valid_files_exit_zero(tmp_path: Path) -> None:
    (tmp_path / "valid.yaml").write_text(VALID)
    result = run("-f", tmp_path / "valid.yaml")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "2 objects checked, 0 invalid\n"
    assert result.stderr == ""


def test_each_invalid_object_is_named_with_its_file(tmp_path: Path) -> None:
    (tmp_path / "valid.yaml").write_text(VALID)
    bad = tmp_path / "bad.yaml"
    bad.write_text(INVALID)
    result = run("-f", tmp_path / "valid.yaml", bad)
    assert result.returncode == 1
    assert result.stdout == "5 objects checked, 2 invalid\n"
    lines = result.stderr.splitlines()
    assert lines[0] == f"{bad}[doc 1] VirtualService bookinfo/negative: error: weight -5 < 0"
    assert lines[1].startswith(f"{bad}[doc 2] AuthorizationPolicy bookinfo/deny-all: error: ")
    assert "NOPE" in lines[1]
    assert len(lines) == 2


def test_warnings_do_not_fail(tmp_path: Path) -> None:
    (tmp_path / "warn.yaml").write_text(WARNING)
    result = run("-f", tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stderr == (
        f"{tmp_path / 'warn.yaml'}[doc 0] VirtualService bookinfo/mirrored: warning: "
        'using deprecated setting "mirrorPercent", use "mirrorPercentage" instead\n'
    )


def test_unreadable_input_fails_cleanly(tmp_path: Path) -> None:
    (tmp_path / "broken.yaml").write_text("kind: [unclosed\n")
    (tmp_path / "unknown.yaml").write_text("apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: w}\n")
    result = run("-f", tmp_path / "broken.yaml", tmp_path / "unknown.yaml", tmp_path / "missing.yaml")
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert f"{tmp_path / 'broken.yaml'}[doc 0]: error: invalid YAML" in result.stderr
    assert "unknown kind example.com/Widget" in result.stderr
    assert f"{tmp_path / 'missing.yaml'}: no such file" in result.stderr


def test_files_are_required() -> None:
    result = run()
    assert result.returncode == 2
    assert "-f" in result.stderr


def test_webhook_address_flag() -> None:
    parse = build_parser().parse_args
    assert parse(["discovery"]).webhook_addr == Address("", 15017)
    assert parse(["discovery", "--webhook-addr", "127.0.6.9:9443"]).webhook_addr == Address("127.0.6.9", 9443)
    assert parse(["discovery", "--webhook-addr", "off"]).webhook_addr is None
    assert parse(["discovery", "--webhook-addr", ""]).webhook_addr is None
