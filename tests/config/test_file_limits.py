"""Files that once stalled or bloated the server are rejected by name and limit, cheaply."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import yaml
from support.bad_files import alias_bomb
from support.kube import istio, write

from meshpilot.config.file_limits import FileLimits
from meshpilot.config.file_loader import load_file
from meshpilot.config.file_source import config_files
from meshpilot.input_limits import (
    MAX_NESTING,
    InputRejected,
    NestingExceeded,
    load_json,
    load_yaml,
    measure_nesting,
)


def test_an_alias_bomb_is_rejected_without_expanding_it(tmp_path: Path) -> None:
    path = tmp_path / "bomb.yaml"
    path.write_text(alias_bomb())
    started = time.perf_counter()
    [doc] = load_file(path)
    assert time.perf_counter() - started < 1.0
    assert doc.obj is None and doc.rejection is not None
    # Not even its name is read (a name may be a bomb too): the file keeps what it defined before.
    assert doc.key is None
    assert "YAML aliases expand it by more than the limit of 100,000 values" in doc.rejection.reason
    assert doc.where == f"{path}[doc 0]"


def test_modest_aliases_and_merge_keys_still_load(tmp_path: Path) -> None:
    path = tmp_path / "anchors.yaml"
    path.write_text(
        "apiVersion: v1\nkind: List\nitems:\n"
        "- apiVersion: networking.istio.io/v1\n  kind: ServiceEntry\n"
        "  metadata: {name: a, namespace: default, labels: &l {team: x}}\n"
        "  spec: &spec\n    hosts: [a.example.com]\n"
        "    ports: [{number: 80, name: http, protocol: HTTP}]\n    resolution: DNS\n"
        "- apiVersion: networking.istio.io/v1\n  kind: ServiceEntry\n"
        "  metadata: {name: b, namespace: default, labels: {<<: *l, tier: y}}\n"
        "  spec: {<<: *spec, hosts: [b.example.com]}\n"
    )
    docs = load_file(path)
    assert [d.obj.meta.name for d in docs if d.obj is not None] == ["a", "b"]
    assert docs[1].obj is not None and docs[1].obj.meta.labels == {"team": "x", "tier": "y"}


def test_a_recursive_alias_and_deep_nesting_are_rejected(tmp_path: Path) -> None:
    path = tmp_path / "odd.yaml"
    deep = "[" * 500 + "]" * 500
    path.write_text(f"a: &a [*a]\n---\nkind: Service\nmetadata: {{name: deep}}\nspec: {deep}\n")
    loop, too_deep = load_file(path)
    assert loop.rejection is not None and "refers to a node that contains it" in loop.rejection.reason
    assert too_deep.rejection is not None
    assert "nested deeper than the limit of 100 levels" in too_deep.rejection.reason


def test_a_file_over_the_size_limit_is_rejected_whole_before_reading(tmp_path: Path) -> None:
    path = tmp_path / "huge.yaml"
    with path.open("wb") as f:
        f.truncate(50 * 1024 * 1024)  # 50 MB, sparse: reading it is what must not happen
    started = time.perf_counter()
    [doc] = load_file(path)
    assert time.perf_counter() - started < 0.5
    assert doc.rejection is not None and doc.where == str(path) and doc.rejection.object == "file"
    assert doc.rejection.reason == "file is 52,428,800 bytes, over the limit of 16,777,216 bytes"


def test_too_many_documents_reject_the_file(tmp_path: Path) -> None:
    path = tmp_path / "many.yaml"
    path.write_text("---\nkind: Namespace\nmetadata: {name: x}\n" * 11)
    [doc] = load_file(path, FileLimits(max_documents=10))
    assert doc.rejection is not None and "more than the limit of 10 documents" in doc.rejection.reason
    items = {"apiVersion": "v1", "kind": "List", "items": [{"kind": "Namespace"}] * 11}
    path.write_text(yaml.safe_dump(items))
    [doc] = load_file(path, FileLimits(max_documents=10))
    assert doc.rejection is not None and "more than the limit of 10 documents" in doc.rejection.reason


def test_binary_garbage_devices_and_fifos_are_rejected(tmp_path: Path) -> None:
    (tmp_path / "garbage.yaml").write_bytes(os.urandom(200_000))
    (tmp_path / "zero.yaml").symlink_to("/dev/zero")
    os.mkfifo(tmp_path / "fifo.yaml")
    reasons = {p.name: [d.rejection.reason for d in load_file(p) if d.rejection] for p in tmp_path.iterdir()}
    assert reasons == {
        "garbage.yaml": ["file is not UTF-8 text"],
        "zero.yaml": ["not a regular file"],
        "fifo.yaml": ["not a regular file"],
    }


@pytest.mark.timeout(10)
def test_symlink_loops_are_walked_once(tmp_path: Path) -> None:
    write(tmp_path / "a.yaml", [istio("Sidecar", "s", "default", {})])
    write(tmp_path / "sub" / "b.yaml", [istio("Sidecar", "t", "default", {})])
    (tmp_path / "loop1").symlink_to(".")
    (tmp_path / "loop2").symlink_to(tmp_path)
    (tmp_path / "sub" / "up").symlink_to("..")
    (tmp_path / "sub" / "self").symlink_to("../sub")
    # A ConfigMap volume: the files are links into a hidden, versioned directory.
    write(tmp_path / "..2024_01_01" / "c.yaml", [istio("Sidecar", "u", "default", {})])
    (tmp_path / "..data").symlink_to("..2024_01_01")
    (tmp_path / "c.yaml").symlink_to("..data/c.yaml")
    found = [p.relative_to(tmp_path).as_posix() for p in config_files(tmp_path)]
    assert found == ["a.yaml", "c.yaml", "sub/b.yaml"]


def nested(levels: int, leaf: object = 1) -> object:
    value = leaf
    for _ in range(levels):
        value = [value]
    return value


def test_config_files_and_client_input_share_one_nesting_limit(tmp_path: Path) -> None:
    assert FileLimits().max_depth == MAX_NESTING
    # The document's top-level object is one of the levels; the scalar at the bottom is none.
    within, over = nested(MAX_NESTING - 1), nested(MAX_NESTING)
    for value, ok in ((within, True), (over, False)):
        path = write(tmp_path / "deep.yaml", [{"kind": "Service", "metadata": {"name": "s"}, "spec": value}])
        [doc] = load_file(path)
        reason = doc.rejection.reason if doc.rejection is not None else ""
        assert ("nested deeper than the limit of 100 levels" not in reason) is ok, reason
        text = json.dumps({"spec": value})
        for load in (load_json, load_yaml):
            if ok:
                load(text, "x")
            else:
                with pytest.raises(InputRejected, match="x: nested deeper than the limit of 100 levels"):
                    load(text, "x")


def test_the_nesting_check_is_iterative_and_walks_shared_containers_once() -> None:
    measure_nesting(nested(MAX_NESTING))
    with pytest.raises(NestingExceeded, match="nested deeper than the limit of 100 levels"):
        measure_nesting(nested(50_000))  # far past Python's recursion limit: no RecursionError
    # Ten levels each using the one below ten times: 10^10 values expanded, 10 containers walked.
    shared: list[object] = ["lol"] * 10
    for _ in range(10):
        shared = [shared] * 10
    started = time.perf_counter()
    measure_nesting(shared, max_alias_values=None)
    with pytest.raises(NestingExceeded, match="more than the limit of 100,000 values"):
        measure_nesting(shared, max_alias_values=100_000)
    assert time.perf_counter() - started < 0.5
    # A shared container is as deep at every use: reused below 95 levels it is too deep.
    deep = nested(10)
    measure_nesting([deep, nested(80, deep)], max_alias_values=None)
    with pytest.raises(NestingExceeded, match="nested deeper"):
        measure_nesting([deep, nested(95, deep)], max_alias_values=None)
    # Values count as in the expansion, keys too: {"a": [1, 2]} is 5, and each use after the first adds them.
    part = {"a": [1, 2]}
    measure_nesting([part, part, part], max_alias_values=10)
    with pytest.raises(NestingExceeded, match="more than the limit of 9 values"):
        measure_nesting([part, part, part], max_alias_values=9)
    loop: list[object] = []
    loop.append(loop)
    with pytest.raises(NestingExceeded, match="refers to a node that contains it"):
        measure_nesting(loop)
