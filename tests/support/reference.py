"""Istio's and Kubernetes' own programs and files, built by `make reference` from pinned Go modules.

Tests that use them are marked ``reference``. Where Go is absent they skip with one line naming
`make reference`; where ``MESHPILOT_REQUIRE_REFERENCE=1`` (`make test` on a machine with Go, and
so CI) a missing binary fails the test instead, so a referee that silently did not run cannot pass.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = ROOT / "build" / "reference" / "bin"
ISTIO_MODULE = ROOT / "reference" / "istio"
REQUIRED = os.environ.get("MESHPILOT_REQUIRE_REFERENCE") == "1"


def missing(what: str) -> None:
    """Skip (or, where the referee is required, fail) because ``what`` is not there."""
    message = f"{what}: run `make reference` (needs Go)"
    if REQUIRED:
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


def binary(name: str) -> Path:
    """A reference binary's path: pilot-discovery, pilot-agent, istioctl, xdsdump, kube-apiserver, etcd."""
    path = BIN / name
    if not os.access(path, os.X_OK):
        missing(f"no {path.relative_to(ROOT)}")
    return path


@functools.cache
def _istio_source() -> Path | None:
    go = shutil.which("go")
    if go is None:
        return None
    done = subprocess.run(
        [go, "list", "-m", "-f", "{{.Dir}}", "istio.io/istio"],
        cwd=ISTIO_MODULE,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    directory = Path(done.stdout.strip())
    return directory if done.returncode == 0 and directory.is_dir() else None


def istio_file(path: str) -> str:
    """A file of the pinned ``istio.io/istio`` module (from Go's module cache), such as a chart template."""
    source = _istio_source()
    if source is None:
        missing("the istio.io/istio module is not in Go's module cache")
    assert source is not None
    return (source / path).read_text()
