"""The allocator decision of ``meshpilot discovery`` (``server.allocator``): when jemalloc is preloaded
by running the command again, and when the operator's setting or a missing library keeps the system's."""

from __future__ import annotations

import ctypes.util
import logging
import sys
from pathlib import Path

import pytest

from meshpilot.server import allocator
from meshpilot.server.allocator import MALLOC_CONF, AllocatorError, decide

LIB = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"


def test_jemalloc_is_preloaded_by_default_with_objects_on_malloc() -> None:
    choice = decide({}, LIB, mapped=False)
    assert choice.allocator == "jemalloc"
    assert choice.environment == {"LD_PRELOAD": LIB, "MALLOC_CONF": MALLOC_CONF, "PYTHONMALLOC": "malloc"}


def test_the_operators_malloc_conf_and_pythonmalloc_are_kept() -> None:
    choice = decide({"MALLOC_CONF": "narenas:1", "PYTHONMALLOC": "pymalloc"}, LIB, mapped=False)
    assert choice.environment == {"LD_PRELOAD": LIB, "MALLOC_CONF": "narenas:1", "PYTHONMALLOC": "pymalloc"}


@pytest.mark.parametrize(
    ("environ", "library", "why"),
    [
        ({"MESHPILOT_ALLOCATOR": "system"}, LIB, "MESHPILOT_ALLOCATOR=system"),
        ({"MESHPILOT_ALLOCATOR": " System "}, LIB, "MESHPILOT_ALLOCATOR=system"),
        ({"LD_PRELOAD": "/opt/libfaketime.so"}, LIB, "LD_PRELOAD=/opt/libfaketime.so is the operator's"),
        # A run again whose preload the loader refused lands here: it is not tried a third time.
        ({"LD_PRELOAD": LIB, "MALLOC_CONF": MALLOC_CONF}, LIB, f"LD_PRELOAD={LIB} is the operator's"),
        ({}, None, "jemalloc is not installed"),
        ({"MESHPILOT_ALLOCATOR": "jemalloc"}, None, "jemalloc is not installed"),
    ],
)
def test_the_system_allocator_stays(environ: dict[str, str], library: str | None, why: str) -> None:
    choice = decide(environ, library, mapped=False)
    assert choice.allocator == "system"
    assert not choice.environment
    assert choice.reason.startswith(why)


def test_once_preloaded_it_is_reported_not_run_again() -> None:
    environ = {"LD_PRELOAD": LIB, "MALLOC_CONF": MALLOC_CONF, "PYTHONMALLOC": "malloc"}
    choice = decide(environ, LIB, mapped=True)
    assert choice.allocator == "jemalloc" and not choice.environment
    assert MALLOC_CONF in choice.reason and "PYTHONMALLOC malloc" in choice.reason
    # The operator's own preload of jemalloc counts as well, even with MESHPILOT_ALLOCATOR=system.
    assert decide({"MESHPILOT_ALLOCATOR": "system"}, LIB, mapped=True).allocator == "jemalloc"


def test_an_unknown_setting_is_refused() -> None:
    with pytest.raises(
        AllocatorError, match="MESHPILOT_ALLOCATOR='tcmalloc': expected one of jemalloc, system"
    ):
        decide({"MESHPILOT_ALLOCATOR": "tcmalloc"}, LIB, mapped=False)


def _prepare(
    monkeypatch: pytest.MonkeyPatch, environ: dict[str, str], *, reexec: bool = True
) -> tuple[allocator.Choice, list[tuple[str, list[str], dict[str, str]]]]:
    monkeypatch.setattr(allocator, "find_jemalloc", lambda: LIB)
    monkeypatch.setattr(allocator, "jemalloc_mapped", lambda: False)
    calls: list[tuple[str, list[str], dict[str, str]]] = []

    def execve(path: str, args: list[str], env: dict[str, str]) -> None:
        calls.append((path, args, env))

    choice = allocator.prepare(
        ["discovery", "--config-dir", "/cfg"], reexec=reexec, environ=environ, execve=execve
    )
    return choice, calls


def test_prepare_runs_the_same_command_again_with_the_preload(monkeypatch: pytest.MonkeyPatch) -> None:
    _, calls = _prepare(monkeypatch, {"PATH": "/bin", "POD_NAME": "istiod-0"})
    assert calls == [
        (
            sys.executable,
            [sys.executable, "-m", "meshpilot.cli.main", "discovery", "--config-dir", "/cfg"],
            {
                "PATH": "/bin",
                "POD_NAME": "istiod-0",
                "LD_PRELOAD": LIB,
                "MALLOC_CONF": MALLOC_CONF,
                "PYTHONMALLOC": "malloc",
            },
        )
    ]


def test_prepare_does_not_replace_a_caller_or_an_operators_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    choice, calls = _prepare(monkeypatch, {}, reexec=False)
    assert not calls and choice.allocator == "system"
    choice, calls = _prepare(monkeypatch, {"MESHPILOT_ALLOCATOR": "system"})
    assert not calls and choice.allocator == "system"


def test_the_library_is_found_at_its_debian_path_or_by_the_linker(monkeypatch: pytest.MonkeyPatch) -> None:
    assert allocator.find_jemalloc(lambda path: path == allocator.KNOWN_PATHS[0]) == allocator.KNOWN_PATHS[0]
    monkeypatch.setattr(ctypes.util, "find_library", lambda name: f"lib{name}.so.2")
    assert allocator.find_jemalloc(lambda path: False) == "libjemalloc.so.2"
    monkeypatch.setattr(ctypes.util, "find_library", lambda name: None)
    assert allocator.find_jemalloc(lambda path: False) is None


def test_mapped_reads_the_process_maps(tmp_path: Path) -> None:
    maps = tmp_path / "maps"
    maps.write_text("7f00-7f01 r-xp 00000000 08:01 1 /usr/lib/x86_64-linux-gnu/libjemalloc.so.2\n")
    assert allocator.jemalloc_mapped(maps)
    maps.write_text("7f00-7f01 r-xp 00000000 08:01 1 /usr/lib/x86_64-linux-gnu/libc.so.6\n")
    assert not allocator.jemalloc_mapped(maps)
    assert not allocator.jemalloc_mapped(tmp_path / "absent")


@pytest.mark.parametrize(
    ("environ", "library"),
    [
        ({"MESHPILOT_ALLOCATOR": "jemalloc"}, None),
        ({"MESHPILOT_ALLOCATOR": "jemalloc", "LD_PRELOAD": "/x.so"}, LIB),
    ],
)
def test_jemalloc_asked_for_and_not_had_is_a_warning(
    environ: dict[str, str], library: str | None, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="meshpilot.server.allocator")
    choice = decide(environ, library, mapped=False)
    assert choice.refused and choice.allocator == "system"
    allocator.log_choice(choice)
    assert [r.levelname for r in caplog.records] == ["WARNING"]
    assert "although MESHPILOT_ALLOCATOR=jemalloc" in caplog.records[0].getMessage()
    # The default, not asked for: said at start, not warned about.
    caplog.clear()
    allocator.log_choice(decide({}, None, mapped=False))
    assert [r.levelname for r in caplog.records] == ["INFO"]


def test_a_new_process_is_decided_by_its_environment_not_this_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    # This process may itself run on jemalloc; the answer is about the process to be started.
    monkeypatch.setattr(allocator, "jemalloc_mapped", lambda: True)
    monkeypatch.setattr(allocator, "find_jemalloc", lambda: LIB)
    assert allocator.for_new_process({}).environment["LD_PRELOAD"] == LIB
    assert allocator.for_new_process({"MESHPILOT_ALLOCATOR": "system"}).allocator == "system"
    # The operator's preload of jemalloc: the new process runs on it, and nothing is added.
    preloaded = allocator.for_new_process({"LD_PRELOAD": LIB})
    assert preloaded.allocator == "jemalloc" and not preloaded.environment
    assert allocator.for_new_process({"LD_PRELOAD": "/opt/libfaketime.so"}).allocator == "system"
    monkeypatch.setattr(allocator, "find_jemalloc", lambda: None)
    assert allocator.for_new_process({}).describe().startswith("system (jemalloc is not installed")
