"""The referee of the deploy tests: istiod's manifests as Istio renders them.

``istioctl manifest generate`` (the reference build of the pinned ``istio.io/istio``) renders the
``istio-discovery`` chart it embeds, the chart under ``manifests/charts/istio-control/istio-discovery``
of that module, with the default profile's values; ``--set`` changes one (``values.global.istiod.
enableAnalysis=true``). No Helm template is re-implemented here.
"""

from __future__ import annotations

import functools
import subprocess
from collections.abc import Callable
from typing import Any

import pytest
import yaml
from support.reference import binary

Objects = list[dict[str, Any]]


@functools.cache
def _render(sets: tuple[str, ...]) -> str:
    argv = [str(binary("istioctl")), "manifest", "generate"]
    for value in sets:
        argv += ["--set", value]
    return subprocess.run(argv, check=True, capture_output=True, text=True, timeout=60).stdout


@pytest.fixture(scope="session")
def istio_rendered() -> Callable[..., Objects]:
    """``istio_rendered(*sets)``: the objects ``istioctl manifest generate --set ...`` prints."""

    def render(*sets: str) -> Objects:
        return [doc for doc in yaml.safe_load_all(_render(tuple(sets))) if doc]

    return render
