"""Golden files: the xDS resources meshpilot generates for representative configs, checked in.

Each case under ``cases/`` is a directory with ``config.yaml`` (Kubernetes and
Istio objects), optionally ``mesh.yaml`` (MeshConfig) and ``proxies.yaml``
(node IDs with metadata, one golden file each). The test generates CDS, LDS,
RDS (the names the listeners ask for) and EDS (the EDS clusters' names) for
each proxy through the same generators the ADS server uses, and compares the
JSON with ``<proxy>.golden.json`` beside it. A change of shape is then a
visible diff in review. To accept a change, run with ``UPDATE_GOLDEN=1`` and
read the diff before committing it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.golden import generate

CASES = Path(__file__).parent / "cases"
UPDATE = os.environ.get("UPDATE_GOLDEN") == "1"


def _cases() -> list[Any]:
    out = []
    for case in sorted(p for p in CASES.iterdir() if p.is_dir()):
        proxies = yaml.safe_load((case / "proxies.yaml").read_text())
        for name, proxy in proxies.items():
            out.append(pytest.param(case, name, proxy, id=f"{case.name}/{name}"))
    return out


@pytest.mark.parametrize(("case", "name", "proxy"), _cases())
def test_generated_resources_match_the_golden_file(case: Path, name: str, proxy: dict[str, Any]) -> None:
    got = generate(case, proxy["id"], proxy.get("metadata") or {}, proxy.get("listeners"))
    text = json.dumps(got, indent=1, sort_keys=True) + "\n"
    golden = case / f"{name}.golden.json"
    if UPDATE or not golden.exists():
        golden.write_text(text)
        if not UPDATE:
            pytest.fail(f"{golden} did not exist; written now: review and commit it")
    assert text == golden.read_text(), (
        f"generated resources differ from {golden}; if the change is intended, rerun with UPDATE_GOLDEN=1"
    )
