"""The config directory: objects follow the files, bad documents are reported and change nothing else."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path
from typing import Any

import pytest
from support.kube import istio, service, write

from meshpilot.config.decode import Decoded
from meshpilot.config.file_loader import InlineLoader, LoadedDocument
from meshpilot.config.file_source import FileSource
from meshpilot.model.kind import Kind


class RecordingSink:
    def __init__(self) -> None:
        self.objects: dict[tuple[Kind, str, str], Decoded] = {}
        self.events: list[tuple[str, Kind, str, str]] = []

    def upsert(self, obj: Decoded) -> None:
        key = (obj.kind, obj.meta.namespace, obj.meta.name)
        self.objects[key] = obj
        self.events.append(("upsert", *key))

    def remove(self, kind: Kind, namespace: str, name: str) -> None:
        del self.objects[(kind, namespace, name)]
        self.events.append(("remove", kind, namespace, name))

    def batch(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()


def vs(name: str, host: str, **extra: Any) -> dict[str, Any]:
    spec = {"hosts": [host], "http": [{"route": [{"destination": {"host": host}}]}], **extra}
    return istio("VirtualService", name, "default", spec)


@pytest.fixture
def source(tmp_path: Path) -> tuple[FileSource, RecordingSink, Path]:
    sink = RecordingSink()
    return FileSource(tmp_path, sink), sink, tmp_path


def test_add_change_and_delete_files(source: tuple[FileSource, RecordingSink, Path]) -> None:
    src, sink, root = source
    write(root / "a.yaml", [service("reviews", "default", "10.0.0.1", [("http", 9080)]), vs("r", "reviews")])
    write(root / "sub" / "b.yml", [vs("ratings", "ratings")])
    (root / "ignored.txt").write_text("kind: Service")
    (root / ".hidden.yaml").write_text("kind: Service")
    assert src.sync()
    assert set(sink.objects) == {
        (Kind.SERVICE, "default", "reviews"),
        (Kind.VIRTUAL_SERVICE, "default", "r"),
        (Kind.VIRTUAL_SERVICE, "default", "ratings"),
    }
    assert not src.sync(), "nothing changed, nothing is re-read"

    sink.events.clear()
    write(
        root / "a.yaml",
        [service("reviews", "default", "10.0.0.1", [("http", 9080)]), vs("r", "reviews.other")],
    )
    assert src.sync()
    assert sink.events == [("upsert", Kind.VIRTUAL_SERVICE, "default", "r")], "only the changed object"

    sink.events.clear()
    (root / "a.yaml").unlink()
    assert src.sync()
    assert sorted(e[0] for e in sink.events) == ["remove", "remove"]
    assert set(sink.objects) == {(Kind.VIRTUAL_SERVICE, "default", "ratings")}


def test_a_bad_document_is_logged_with_file_index_and_reason_and_others_apply(
    source: tuple[FileSource, RecordingSink, Path], caplog: pytest.LogCaptureFixture
) -> None:
    src, sink, root = source
    path = write(
        root / "mixed.yaml",
        [
            vs("good", "reviews"),
            istio("VirtualService", "bad", "default", {"hosts": ["x"], "http": [{"timeout": "soon"}]}),
            {"apiVersion": "v1", "kind": "Gizmo", "metadata": {"name": "g"}},
            {"apiVersion": "v1", "kind": "Service", "metadata": {}},
        ],
    )
    with caplog.at_level(logging.ERROR):
        src.sync()
    assert set(sink.objects) == {(Kind.VIRTUAL_SERVICE, "default", "good")}
    messages = "\n".join(r.getMessage() for r in caplog.records)
    assert (
        f"{path}[doc 1]: VirtualService default/bad rejected: spec.http[0].timeout: invalid duration 'soon'"
        in (messages)
    )
    assert f"{path}[doc 2]: Gizmo g rejected: kind: unknown kind Gizmo" in messages
    assert f"{path}[doc 3]: Service rejected: metadata.name: name is required" in messages
    assert [r.where for r in src.rejections] == [f"{path}[doc 1]", f"{path}[doc 2]", f"{path}[doc 3]"]


def test_an_object_that_turns_invalid_keeps_its_last_valid_version(
    source: tuple[FileSource, RecordingSink, Path],
) -> None:
    src, sink, root = source
    write(
        root / "a.yaml",
        [vs("r", "reviews", http=[{"timeout": "1s", "route": [{"destination": {"host": "reviews"}}]}])],
    )
    src.sync()
    before = sink.objects[(Kind.VIRTUAL_SERVICE, "default", "r")]
    write(root / "a.yaml", [vs("r", "reviews", http=[{"timeout": "never"}])])
    src.sync()
    assert sink.objects[(Kind.VIRTUAL_SERVICE, "default", "r")] is before
    assert len(src.rejections) == 1

    write(
        root / "a.yaml",
        [vs("r", "reviews", http=[{"timeout": "2s", "route": [{"destination": {"host": "reviews"}}]}])],
    )
    src.sync()
    fixed = sink.objects[(Kind.VIRTUAL_SERVICE, "default", "r")]
    assert fixed.spec.http[0].timeout.seconds == 2  # type: ignore[union-attr]
    assert src.rejections == []


def test_unreadable_documents_do_not_delete_what_the_file_defined(
    source: tuple[FileSource, RecordingSink, Path],
) -> None:
    src, sink, root = source
    path = write(root / "a.yaml", [vs("r", "reviews"), vs("s", "ratings")])
    src.sync()
    path.write_text(path.read_text().replace("hosts:", "hosts: [[[", 1))
    src.sync()
    assert {k[2] for k in sink.objects} == {"r", "s"}
    assert src.rejections


def test_duplicate_definitions_resolve_to_the_first_file(
    source: tuple[FileSource, RecordingSink, Path], caplog: pytest.LogCaptureFixture
) -> None:
    src, sink, root = source
    write(root / "b.yaml", [vs("r", "from-b")])
    write(root / "a.yaml", [vs("r", "from-a")])
    with caplog.at_level(logging.ERROR):
        src.sync()
    assert list(sink.objects[(Kind.VIRTUAL_SERVICE, "default", "r")].spec.hosts) == ["from-a"]  # type: ignore[union-attr]
    assert "is also defined in" in caplog.text
    (root / "a.yaml").unlink()
    src.sync()
    assert list(sink.objects[(Kind.VIRTUAL_SERVICE, "default", "r")].spec.hosts) == ["from-b"]  # type: ignore[union-attr]


def test_objects_without_namespace_land_in_default_and_cluster_scoped_have_none(
    source: tuple[FileSource, RecordingSink, Path],
) -> None:
    src, sink, root = source
    write(
        root / "a.yaml",
        [
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "prod", "namespace": "ignored"}},
            {
                "apiVersion": "networking.istio.io/v1alpha3",
                "kind": "VirtualService",
                "metadata": {"name": "r"},
                "spec": {"hosts": ["a"], "tcp": [{"route": [{"destination": {"host": "a"}}]}]},
            },
        ],
    )
    src.sync()
    assert set(sink.objects) == {(Kind.NAMESPACE, "", "prod"), (Kind.VIRTUAL_SERVICE, "default", "r")}


async def test_watching_applies_changes(source: tuple[FileSource, RecordingSink, Path]) -> None:
    src, sink, root = source
    src.sync()
    stop = asyncio.Event()
    task = asyncio.create_task(src.run(stop))
    await asyncio.sleep(0.3)
    write(root / "new.yaml", [vs("r", "reviews")])
    for _ in range(100):
        if sink.objects:
            break
        await asyncio.sleep(0.05)
    stop.set()
    await asyncio.wait_for(task, 5)
    assert set(sink.objects) == {(Kind.VIRTUAL_SERVICE, "default", "r")}


def deny_admin(**extra: Any) -> dict[str, Any]:
    spec = {"action": "DENY", "rules": [{"to": [{"operation": {"paths": ["/admin*"]}}]}], **extra}
    return istio("AuthorizationPolicy", "deny-admin", "default", spec, group="security")


DENY_ADMIN = (Kind.AUTHORIZATION_POLICY, "default", "deny-admin")


class WatchingSink(RecordingSink):
    """Fails a remove of ``guarded``, and counts batches."""

    def __init__(self, guarded: tuple[Kind, str, str]) -> None:
        super().__init__()
        self.guarded = guarded
        self.batches = 0

    def remove(self, kind: Kind, namespace: str, name: str) -> None:
        assert (kind, namespace, name) != self.guarded, f"{name} was removed from the sink"
        super().remove(kind, namespace, name)

    def batch(self) -> contextlib.AbstractContextManager[None]:
        self.batches += 1
        return contextlib.nullcontext()


class GatedLoader:
    """Loads inline, but holds the file named ``slow`` until ``release`` is set."""

    def __init__(self, slow: str) -> None:
        self.inline = InlineLoader()
        self.slow = slow
        self.waiting = asyncio.Event()
        self.release = asyncio.Event()
        self.loaded: list[str] = []

    async def load(self, path: Path) -> list[LoadedDocument]:
        if path.name == self.slow:
            self.waiting.set()
            await self.release.wait()
        self.loaded.append(path.name)
        return await self.inline.load(path)

    async def close(self) -> None:
        return None


@pytest.mark.parametrize(("source_file", "target_file"), [("a.yaml", "b.yaml"), ("b.yaml", "a.yaml")])
async def test_an_object_moved_between_files_is_never_missing(
    tmp_path: Path, source_file: str, target_file: str
) -> None:
    sink = WatchingSink(DENY_ADMIN)
    loader = GatedLoader(slow=target_file)
    src = FileSource(tmp_path, sink, loader=loader)
    write(tmp_path / source_file, [deny_admin(), vs("r", "reviews")])
    write(tmp_path / target_file, [vs("ratings", "ratings")])
    loader.release.set()
    assert await src.refresh()
    assert DENY_ADMIN in sink.objects
    loader.release.clear()
    loader.waiting.clear()

    # One edit: the policy leaves one file and (changed a little) lands in the other, which loads slowly.
    write(tmp_path / source_file, [vs("r", "reviews")])
    write(
        tmp_path / target_file, [vs("ratings", "ratings"), deny_admin(selector={"matchLabels": {"app": "x"}})]
    )
    refresh = asyncio.create_task(src.refresh())
    await asyncio.wait_for(loader.waiting.wait(), 5)
    for _ in range(10):
        await asyncio.sleep(0)
    assert DENY_ADMIN in sink.objects, "the policy is still there while the other file loads"
    before = len(sink.events)
    loader.release.set()
    assert await asyncio.wait_for(refresh, 5)
    assert sink.events[before:] == [("upsert", *DENY_ADMIN)], "one upsert, no remove"
    assert sink.batches == 2, "one batch per refresh, not one per file"

    # Moved back unchanged: the sink hears nothing at all about it.
    write(tmp_path / target_file, [vs("ratings", "ratings")])
    write(tmp_path / source_file, [vs("r", "reviews"), deny_admin(selector={"matchLabels": {"app": "x"}})])
    loader.release.set()
    before = len(sink.events)
    assert await src.refresh()
    assert sink.events[before:] == []
    assert DENY_ADMIN in sink.objects and src.object_count() == 3


async def test_a_refresh_stopped_while_loading_changes_nothing(tmp_path: Path) -> None:
    sink = WatchingSink(DENY_ADMIN)
    loader = GatedLoader(slow="b.yaml")
    src = FileSource(tmp_path, sink, loader=loader)
    write(tmp_path / "a.yaml", [deny_admin()])
    loader.release.set()
    await src.refresh()
    loader.release.clear()
    loader.waiting.clear()
    (tmp_path / "a.yaml").unlink()
    write(tmp_path / "b.yaml", [deny_admin()])
    refresh = asyncio.create_task(src.refresh())
    await asyncio.wait_for(loader.waiting.wait(), 5)
    refresh.cancel()
    with pytest.raises(asyncio.CancelledError):
        await refresh
    assert set(sink.objects) == {DENY_ADMIN}
    loader.release.set()
    assert await src.refresh()  # the next refresh finds both changes again
    assert set(sink.objects) == {DENY_ADMIN}
    first = sink.objects[DENY_ADMIN]
    write(tmp_path / "b.yaml", [deny_admin(selector={"matchLabels": {"app": "x"}})])
    assert await src.refresh()
    assert sink.objects[DENY_ADMIN] != first, "b.yaml defines it now"


async def test_many_files_load_one_after_another_and_apply_in_one_batch(tmp_path: Path) -> None:
    sink = WatchingSink(DENY_ADMIN)
    loader = GatedLoader(slow="none")
    src = FileSource(tmp_path, sink, loader=loader)
    for i in range(20):
        write(tmp_path / f"f{i:02}.yaml", [vs(f"r{i}", f"h{i}")])
    (tmp_path / "bad.yaml").write_text("kind: [")
    assert await src.refresh()
    assert sink.batches == 1
    assert loader.loaded == sorted(loader.loaded) and len(loader.loaded) == 21
    assert len(sink.objects) == 20
    assert [r.where for r in src.rejections] == [f"{tmp_path / 'bad.yaml'}[doc 0]"]
