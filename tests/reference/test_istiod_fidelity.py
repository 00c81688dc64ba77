"""istiod is the referee: for every golden case, istiod's own xDS output next to meshpilot's.

``build/reference/bin/xdsdump`` (reference/istio/xdsdump, built by `make reference` from the pinned
``istio.io/istio`` module) serves the case's objects with Istio's in-process discovery server and asks
it over ADS as the case's client asks (a sidecar, or a proxyless gRPC client). The same program then
asks a meshpilot process serving the case's files over its plaintext ADS port, so both servers answer
one client, with the node metadata Istio's agent sends (``support.golden.agent_metadata``). Every
difference must be explained by a rule of ``fidelity.yaml`` beside this file (with its reason and
whether a user would notice); an unexplained one fails, and so does a rule that no longer explains
anything. ``docs/fidelity.md`` is generated from the comparison:
run with ``UPDATE_FIDELITY=1`` to rewrite it, and read its diff before committing.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.fidelity import Difference, ProxyReport, compare, load_rules
from support.golden import agent_metadata
from support.processes import Meshpilot
from support.reference import ROOT, binary

pytestmark = [pytest.mark.reference]

CASES = ROOT / "tests" / "golden" / "cases"
RULES = Path(__file__).with_name("fidelity.yaml")
DOC = ROOT / "docs" / "fidelity.md"
UPDATE = os.environ.get("UPDATE_FIDELITY") == "1"


def _proxies(case: Path) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((case / "proxies.yaml").read_text())
    return loaded


def _nodes(case: Path) -> dict[str, Any]:
    """The case's proxies with the metadata Istio's agent sends: what both servers are given."""
    return {
        name: {
            "id": spec["id"],
            "metadata": agent_metadata(spec["id"], spec.get("metadata") or {}),
            "listeners": spec.get("listeners"),
        }
        for name, spec in _proxies(case).items()
    }


def _xdsdump(case: Path, *where: str) -> dict[str, Any]:
    """What one xDS client (xdsdump) gets for the case's proxies from istiod in-process, or from the
    server ``where`` names; the same client asks both, so both are asked the same things."""
    with tempfile.NamedTemporaryFile("w", suffix=".json") as nodes:
        json.dump(_nodes(case), nodes)
        nodes.flush()
        command = [str(binary("xdsdump")), "--case", str(case), "--proxies", nodes.name, *where]
        done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, f"xdsdump {' '.join(command[1:])} failed:\n{done.stderr[-4000:]}"
    loaded: dict[str, Any] = json.loads(done.stdout)
    return loaded


@functools.cache
def istiod_output(case: Path) -> dict[str, Any]:
    return _xdsdump(case)


@functools.cache
def meshpilot_output(case: Path) -> dict[str, Any]:
    """meshpilot serving the case's files, asked over its plaintext ADS port."""
    with tempfile.TemporaryDirectory(prefix=f"fidelity-{case.name}-") as tmp:
        work = Path(tmp)
        (work / "config").mkdir()
        shutil.copy(case / "config.yaml", work / "config" / "config.yaml")
        mesh = case / "mesh.yaml"
        server = Meshpilot(work, work / "config", mesh_config=mesh if mesh.exists() else None)
        server.start()
        try:
            server.wait_ready()
            return _xdsdump(case, "--server", f"127.0.0.1:{server.grpc_port}")
        finally:
            server.stop()


@functools.cache
def report(case: Path, proxy: str) -> ProxyReport:
    return compare(
        case.name, proxy, istiod_output(case)[proxy], meshpilot_output(case)[proxy], load_rules(RULES)
    )


def _params() -> list[Any]:
    return [
        pytest.param(case, name, id=f"{case.name}/{name}")
        for case in sorted(p for p in CASES.iterdir() if p.is_dir())
        for name in _proxies(case)
    ]


def _show(difference: Difference) -> str:
    def short(value: Any) -> str:
        text = json.dumps(value, sort_keys=True) if not isinstance(value, str) else value
        return text if len(text) <= 300 else text[:300] + "…"

    istiod, ours = short(difference.istiod), short(difference.meshpilot)
    return f"{difference.path}\n    istiod:    {istiod}\n    meshpilot: {ours}"


@pytest.mark.parametrize(("case", "proxy"), _params())
def test_every_difference_from_istiod_is_listed(case: Path, proxy: str) -> None:
    found = report(case, proxy)
    shown = "\n".join(_show(d) for d in found.unexplained[:40])
    assert not found.unexplained, (
        f"{len(found.unexplained)} differences from istiod not explained by {RULES.name}:\n{shown}"
    )


def render() -> str:
    """docs/fidelity.md: per case what matched, and every listed difference with its reason."""
    rules = load_rules(RULES)
    reports = [report(case, proxy) for case, proxy in (p.values for p in _params())]
    used: dict[str, int] = {}
    for r in reports:
        for rule_id, count in r.by_rule.items():
            used[rule_id] = used.get(rule_id, 0) + count
    lines = [
        "# Fidelity: meshpilot's xDS output against istiod's",
        "",
        "Generated by `tests/reference/test_istiod_fidelity.py` (`UPDATE_FIDELITY=1` rewrites it) from",
        "`tests/reference/fidelity.yaml`. For every golden case under `tests/golden/cases`, one xDS",
        "client (`reference/istio/xdsdump`) asks istiod (`istio.io/istio` at the version pinned in",
        "`reference/istio/go.mod`, run in-process) and a meshpilot process serving the same objects for",
        "the same proxy's CDS, LDS, RDS and EDS, as that proxy's client asks, with the node metadata",
        "Istio's agent sends. Resources are compared field by field; each difference must be explained",
        "by a rule below, or the test fails. Unexplained differences: "
        + str(sum(len(r.unexplained) for r in reports))
        + ".",
        "",
        "## Per case",
        "",
        "| case / proxy | type | identical | differ only as listed | unexplained |",
        "|---|---|---:|---:|---:|",
    ]
    for r in reports:
        for kind in ("clusters", "listeners", "routes", "endpoints"):
            unexplained = sum(1 for d in r.unexplained if d.path.startswith(kind))
            lines.append(
                f"| {r.case}/{r.proxy} | {kind} | {r.identical.get(kind, 0)} | {r.explained.get(kind, 0)} "
                f"| {unexplained} |"
            )
    lines += ["", "## Listed differences", ""]
    for rule in rules:
        lines += [
            f"### {rule.id}",
            "",
            f"- Fields: {', '.join(f'`{p}`' for p in rule.paths)}"
            + (f" (cases: {', '.join(rule.cases)})" if rule.cases else ""),
            f"- Differences it explains in this run: {used.get(rule.id, 0)}",
            f"- Why: {rule.reason}",
            f"- Would a user notice: {rule.noticed}",
            "",
        ]
    return "\n".join(lines).rstrip() + "\n"


def test_every_rule_explains_something() -> None:
    """A rule, a pattern of it or a case it names that explains nothing is stale: the difference was
    fixed, so that part of the rule must go."""
    reports = [report(case, proxy) for case, proxy in (p.values for p in _params())]
    patterns = {used for r in reports for used in r.patterns_used}
    cases = {(rule_id, r.case) for r in reports for rule_id in r.by_rule}
    stale = [
        f"{rule.id}: {what}"
        for rule in load_rules(RULES)
        for what in [
            *(f"pattern {glob}" for glob in rule.paths if (rule.id, glob) not in patterns),
            *(f"case {case}" for case in rule.cases if (rule.id, case) not in cases),
        ]
    ]
    assert not stale, f"parts of {RULES.name} that explain no difference any more: {stale}"


def test_fidelity_doc_is_current() -> None:
    text = render()
    if UPDATE:
        DOC.write_text(text)
    assert DOC.exists() and DOC.read_text() == text, (
        f"{DOC.relative_to(ROOT)} is not what the comparison gives; rerun with UPDATE_FIDELITY=1"
    )
