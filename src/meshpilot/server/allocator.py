"""Which C allocator the discovery server runs on: jemalloc when it is installed, chosen before the
interpreter allocates anything by running the command again with it preloaded.

Why: after 10,000 ServiceEntries were added and removed, the server kept 1.6 to 1.9 times its
starting RSS with CPython's small-object allocator and 1.8 to 2.1 with glibc's for every object; the
blocks that outlive such a file are spread through everything it allocated and pin whole arenas or
pages. jemalloc groups blocks by size and returns emptied pages after ``dirty_decay_ms``: with the
model's old snapshots released too, 1.3 and 1.4 times, at no measurable cost in the micro benchmarks
(docs/reliability.md, "Memory after a large file"). Python objects must then go to ``malloc``
(``PYTHONMALLOC=malloc``): CPython maps its small-object arenas itself, past any ``malloc``.

A preload has to be in place when the process starts, so ``prepare`` runs the same command again
(``execve``: same pid, same file descriptors) with ``LD_PRELOAD``, ``MALLOC_CONF`` and
``PYTHONMALLOC`` set; push workers and the config loader inherit that environment. The operator
decides otherwise with ``MESHPILOT_ALLOCATOR=system``, or by setting ``LD_PRELOAD`` (whatever it
names is kept as it is); a ``MALLOC_CONF`` or ``PYTHONMALLOC`` of theirs is kept over the defaults
here. Without the library the server runs on the system's allocator, and says so at start.
"""

from __future__ import annotations

import ctypes.util
import logging
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

#: ``jemalloc`` (the default: used when installed) or ``system``.
ENV = "MESHPILOT_ALLOCATOR"
CHOICES = ("jemalloc", "system")

#: Dirty pages go back to the system after about a second, from jemalloc's own thread (so an idle
#: server returns them too), skipping the lazily freed "muzzy" state whose pages still count in RSS.
MALLOC_CONF = "background_thread:true,dirty_decay_ms:1000,muzzy_decay_ms:0"

#: What a path of jemalloc's library holds, whatever its directory and version.
_LIBRARY_NAME = "libjemalloc"
#: Where Debian and Ubuntu's ``libjemalloc2`` puts it, for the interpreter's architecture.
_MULTIARCH = getattr(sys.implementation, "_multiarch", "")
KNOWN_PATHS = (
    f"/usr/lib/{_MULTIARCH}/libjemalloc.so.2",
    "/usr/lib/libjemalloc.so.2",
    "/usr/lib64/libjemalloc.so.2",
)


class AllocatorError(ValueError):
    """The operator's allocator setting is not one meshpilot knows."""


@dataclass(frozen=True)
class Choice:
    """What the process runs on, in words for the start-up log line; ``environment`` is set only when
    the command is to run again with jemalloc preloaded."""

    allocator: str
    reason: str
    environment: Mapping[str, str] = field(default_factory=dict)
    #: The operator asked for jemalloc (``MESHPILOT_ALLOCATOR=jemalloc``) and does not get it.
    refused: bool = False

    def describe(self) -> str:
        return f"{self.allocator} ({self.reason})"


def find_jemalloc(exists: Callable[[str], bool] = os.path.exists) -> str | None:
    """The path (or, from the linker's cache, the name) of jemalloc's shared library, if installed."""
    for path in KNOWN_PATHS:
        if exists(path):
            return path
    return ctypes.util.find_library("jemalloc")


def jemalloc_mapped(maps: Path = Path("/proc/self/maps")) -> bool:
    """Whether jemalloc is loaded in this process (then it is ``malloc``: it was preloaded)."""
    try:
        text = maps.read_text()
    except OSError:
        return False
    return _LIBRARY_NAME in text


def decide(environ: Mapping[str, str], library: str | None, mapped: bool) -> Choice:
    """The allocator for a process started with ``environ``; raises AllocatorError for a setting of
    ``MESHPILOT_ALLOCATOR`` that is not one of ``CHOICES``."""
    wanted = environ.get(ENV, "").strip().lower() or "jemalloc"
    if wanted not in CHOICES:
        raise AllocatorError(f"{ENV}={environ[ENV]!r}: expected one of {', '.join(CHOICES)}")
    if mapped:
        conf = environ.get("MALLOC_CONF", "jemalloc's defaults")
        objects = environ.get("PYTHONMALLOC", "") or "pymalloc"
        return Choice("jemalloc", f"preloaded; MALLOC_CONF {conf}; PYTHONMALLOC {objects}")
    if wanted == "system":
        return Choice("system", f"{ENV}=system")
    asked = ENV in environ
    preload = environ.get("LD_PRELOAD", "").strip()
    if preload:
        # Also where a run again with our preload lands if the loader refused it: never a second time.
        why = f"LD_PRELOAD={preload} is the operator's and does not load jemalloc"
        return Choice("system", why, refused=asked)
    if library is None:
        return Choice("system", "jemalloc is not installed (Debian: libjemalloc2)", refused=asked)
    env = {
        "LD_PRELOAD": library,
        "MALLOC_CONF": environ.get("MALLOC_CONF") or MALLOC_CONF,
        "PYTHONMALLOC": environ.get("PYTHONMALLOC") or "malloc",
    }
    return Choice("jemalloc", f"to be preloaded from {library}", env)


def for_new_process(environ: Mapping[str, str] = os.environ) -> Choice:
    """What a ``meshpilot`` started now with ``environ`` will run on (``environment``: what its
    start adds). The bench records it, and runs its bare-gRPC floor on the same allocator. An
    ``LD_PRELOAD`` of the operator's that names jemalloc loads it: the process will find it mapped."""
    preloaded = _LIBRARY_NAME in environ.get("LD_PRELOAD", "")
    return decide(environ, find_jemalloc(), mapped=preloaded)


def prepare(
    argv: Sequence[str],
    *,
    reexec: bool,
    environ: Mapping[str, str] = os.environ,
    execve: Callable[[str, list[str], dict[str, str]], object] = os.execve,
) -> Choice:
    """Decide, and when jemalloc is to be preloaded run ``meshpilot <argv>`` again under it (does not
    return then). ``reexec`` False (``main`` called with arguments, inside another program) only
    reports: replacing the caller's process is not this function's to do."""
    choice = decide(environ, find_jemalloc(), jemalloc_mapped())
    if not choice.environment:
        return choice
    if not reexec:
        return Choice("system", "jemalloc is preloaded only when meshpilot is the program started")
    command = [sys.executable, "-m", "meshpilot.cli.main", *argv]
    execve(sys.executable, command, {**environ, **choice.environment})
    # Reached only with an execve that returns (tests): the process did not change.
    return choice


def log_choice(choice: Choice) -> None:
    if choice.refused:
        log.warning("memory allocator: %s, although %s=jemalloc", choice.describe(), ENV)
    else:
        log.info("memory allocator: %s", choice.describe())
