"""The container image (Dockerfile), built and run where a Docker daemon answers.

Where none does (``docker info`` fails) these tests skip: the Dockerfile is then unbuilt, and the
wheel it installs is what ``make test``'s install builds.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from meshpilot import __version__

ROOT = Path(__file__).resolve().parents[2]
TAG = "meshpilot-test:deploy"

pytestmark = [pytest.mark.docker, pytest.mark.timeout(1800)]


def _docker(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    docker = shutil.which("docker")
    assert docker is not None
    return subprocess.run([docker, *args], capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def image() -> Iterator[str]:
    if shutil.which("docker") is None or _docker("info").returncode != 0:
        pytest.skip("no Docker daemon answers (`docker info`): the image is not built here")
    built = _docker("build", "-t", TAG, str(ROOT), timeout=1800)
    assert built.returncode == 0, built.stdout[-4000:] + built.stderr[-4000:]
    yield TAG
    _docker("rmi", "-f", TAG)


def test_the_image_runs_meshpilot_as_istiods_user(image: str) -> None:
    version = _docker("run", "--rm", image, "--version")
    assert version.stdout.strip() == f"meshpilot {__version__}", version.stderr
    user = _docker("run", "--rm", "--entrypoint", "id", image)
    assert user.stdout.startswith("uid=1337(istio-proxy) gid=1337(istio-proxy)"), user.stdout


def test_the_image_has_the_compiled_hot_paths(image: str) -> None:
    script = (
        "import importlib; from meshpilot._ext import SELECTORS; "
        "print(sorted({importlib.import_module(s).IMPLEMENTATION for s in SELECTORS}))"
    )
    ran = _docker("run", "--rm", "--entrypoint", "python", image, "-c", script)
    assert ran.stdout.strip() == "['c']", ran.stderr


def test_the_image_starts_with_the_charts_arguments(image: str) -> None:
    """`discovery` and istiod's flags as the container's arguments, as the Deployment passes them."""
    ran = _docker(
        "run",
        "--rm",
        "--read-only",
        image,
        "discovery",
        "--monitoringAddr=:15014",
        "--log_output_level=default:info",
        "--domain",
        "cluster.local",
        "--keepaliveMaxServerConnectionAge",
        "30m",
        "--help",
    )
    assert ran.returncode == 0, ran.stderr
