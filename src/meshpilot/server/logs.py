"""Logging as istiod logs: its scopes, its per-scope levels, its line and JSON shapes, its flags.

istiod logs under named scopes (``ads``, ``model``, ``kube``, ...) whose levels
``--log_output_level=ads:debug,default:info`` sets one by one. meshpilot logs under its module
names; ``SCOPES`` below says which istiod scope each module logs in (the longest matching prefix
wins), and is the only place that says it. A scope's level is set on the loggers of its modules, so
a disabled debug line costs one cached level check, as a disabled scope costs istiod.

The flags, as istiod reads them (``pkg/log`` of the pinned Istio):

- ``--log_output_level``: ``scope:level,...``; a bare level is the ``default`` scope's and ``all``
  sets every scope. Levels are debug, info, warn, error, fatal, none. A scope meshpilot logs nothing
  in is accepted, and said so once.
- ``--log_as_json``: one JSON object a line with istiod's keys in its order (``level``, ``time``,
  ``scope``, ``caller``, ``msg``, ``stack``); the ``default`` scope is not named, as in istiod.
- ``--log_caller``: scopes (or ``all``) whose lines carry the file and line that logged them.
- ``--log_stacktrace_level``: ``scope:level,...``; lines at that level or worse carry the stack.
- ``--log_target``: ``stdout``, ``stderr`` or a file path, repeatable.

Deliberate differences: the default target is stderr, not istiod's stdout (meshpilot's commands
print their results on stdout); ``--log-level`` (meshpilot's own flag) sets every scope at once; the
``grpc`` scope (gRPC's own logger) logs at the default level, where istiod silences it, so that
gRPC's errors are seen.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
import traceback
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import orjson

LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warn": logging.WARNING,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "fatal": logging.CRITICAL,
    "none": logging.CRITICAL + 1,
}

DEFAULT_SCOPE = "default"
ALL_SCOPES = "all"

#: meshpilot's loggers (module prefixes) and the istiod scope each logs in; the longest prefix wins.
SCOPES: Mapping[str, str] = {
    "meshpilot": DEFAULT_SCOPE,
    "meshpilot.xds": "ads",
    "meshpilot.xds.delta_stream": "delta",
    "meshpilot.xds.delta_protocol": "delta",
    "meshpilot.push": "ads",
    "meshpilot.push.environment": "model",
    "meshpilot.push.jwks_resolver": "model",
    "meshpilot.model": "model",
    "meshpilot.networking.rbac": "authorization",
    "meshpilot.networking.authz_custom": "authorization",
    "meshpilot.networking.policy_problems": "authorization",
    "meshpilot.networking.jwt_authn": "authn",
    "meshpilot.ca": "ca",
    "meshpilot.server.identity": "ca",
    "meshpilot.kube": "kube",
    "meshpilot.kube.status": "status",
    "meshpilot.kube.root_cert": "rootcertrotator",
    "meshpilot.registry.kube": "kube",
    "meshpilot.registry.serviceentry": "serviceentry",
    "meshpilot.config.file_source": "file",
    "meshpilot.config.validation": "validation",
    "meshpilot.webhooks.validate": "validationServer",
    "grpc": "grpc",
}

#: istiod's scopes (``pilot-discovery --help``) that meshpilot logs nothing in: accepted quietly.
ISTIOD_ONLY_SCOPES = frozenset(
    {
        "adsc", "analysis", "controllers", "deltaadsc", "gateway", "gatewaycommon", "grpcgen",
        "ip-autoallocate", "klog", "krt", "monitoring", "pkica", "pkira", "probes", "processing",
        "push", "retry", "secretcontroller", "security", "serverca", "spiffe", "tag-watcher",
        "trustBundle", "untaint", "validationController", "wle",
    }
)  # fmt: skip


def scope_of(logger_name: str) -> str:
    """The istiod scope a logger logs in (non-meshpilot loggers: ``default``)."""
    name = logger_name
    while name:
        found = SCOPES.get(name)
        if found is not None:
            return found
        name = name.rpartition(".")[0]
    return DEFAULT_SCOPE


def parse_levels(text: str) -> dict[str, str]:
    """``scope:level,...`` (a bare level is ``default``'s) as {scope: level}; ValueError when malformed."""
    out: dict[str, str] = {}
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        pieces = item.split(":")
        if len(pieces) > 2:
            raise ValueError(f"invalid output level format {item!r}")
        scope, level = (DEFAULT_SCOPE, pieces[0]) if len(pieces) == 1 else (pieces[0], pieces[1])
        if level not in LEVELS or level == "warning":
            raise ValueError(f"invalid output level {level!r} (one of debug, info, warn, error, fatal, none)")
        out[scope] = level
    return out


def parse_scopes(text: str) -> frozenset[str]:
    """A comma-separated list of scope names (``--log_caller``)."""
    return frozenset(s.strip() for s in text.split(",") if s.strip())


@dataclass(frozen=True, slots=True)
class LogOptions:
    """What the ``--log*`` flags asked for."""

    #: Every scope's level (meshpilot's ``--log-level``); ``levels`` are applied after it.
    level: str = "info"
    levels: Mapping[str, str] = field(default_factory=dict)
    as_json: bool = False
    callers: frozenset[str] = frozenset()
    stacktrace_levels: Mapping[str, str] = field(default_factory=dict)
    targets: tuple[str, ...] = ("stderr",)

    def scope_levels(self) -> dict[str, str]:
        """Each meshpilot scope's level, istiod's ``all`` applied where it stands in the list."""
        levels = {scope: self.level for scope in _scopes()}
        for scope, level in self.levels.items():
            if scope == ALL_SCOPES:
                levels = dict.fromkeys(levels, level)
            elif scope in levels:
                levels[scope] = level
        return levels

    def unknown_scopes(self) -> list[str]:
        """Scopes named in the flags that meshpilot logs nothing in, nor istiod (probably typos)."""
        known = _scopes() | ISTIOD_ONLY_SCOPES | {ALL_SCOPES}
        named = set(self.levels) | set(self.stacktrace_levels) | set(self.callers)
        return sorted(named - known)


def _scopes() -> set[str]:
    return set(SCOPES.values()) | {DEFAULT_SCOPE}


def _timestamp(created: float) -> str:
    base = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created))
    return f"{base}.{int((created % 1) * 1_000_000):06d}Z"


def _level_name(record: logging.LogRecord) -> str:
    if record.levelno >= logging.CRITICAL:
        return "fatal"
    return record.levelname.lower().replace("warning", "warn")


class _Scopes:
    """Which scope a logger is in, and whether its lines carry the caller or the stack; memoized by
    logger name (there are a few hundred)."""

    def __init__(self, callers: Iterable[str] = (), stacktrace_levels: Mapping[str, str] | None = None):
        self.callers = frozenset(callers)
        self.stack_at = {s: LEVELS[level] for s, level in (stacktrace_levels or {}).items()}
        self._memo: dict[str, tuple[str, bool, int]] = {}

    def of(self, name: str) -> tuple[str, bool, int]:
        """(scope, log the caller, lowest level that carries the stack)."""
        found = self._memo.get(name)
        if found is None:
            scope = scope_of(name)
            caller = scope in self.callers or ALL_SCOPES in self.callers
            stack = self.stack_at.get(scope, self.stack_at.get(ALL_SCOPES, LEVELS["none"]))
            found = self._memo[name] = (scope, caller, stack)
        return found


def _caller(record: logging.LogRecord) -> str:
    """``package/file.py:line`` of the call, as zap's short caller names ``package/file.go:line``."""
    path = Path(record.pathname)
    return f"{path.parent.name}/{path.name}:{record.lineno}"


def _stack() -> str:
    """The stack of the logging call, without the logging machinery's own frames."""
    frames = [
        f for f in traceback.extract_stack() if "/logging/" not in f.filename and f.filename != __file__
    ]
    return "".join(traceback.format_list(frames)).rstrip()


class OneLineFormatter(logging.Formatter):
    """istiod's console line: ``2026-01-02T03:04:05.123456Z\\tinfo\\tads\\tmessage`` (the ``default``
    scope unnamed); tracebacks and stacks folded into the line."""

    def __init__(self, scopes: _Scopes | None = None) -> None:
        super().__init__()
        self.scopes = scopes or _Scopes()

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        return _timestamp(record.created)

    def format(self, record: logging.LogRecord) -> str:
        scope, caller, stack_at = self.scopes.of(record.name)
        parts = [_timestamp(record.created), _level_name(record)]
        if scope != DEFAULT_SCOPE:
            parts.append(scope)
        if caller:
            parts.append(_caller(record))
        message = record.getMessage()
        if record.exc_info:
            message = f"{message} | {self.formatException(record.exc_info)}"
        if record.levelno >= stack_at:
            message = f"{message} | {_stack()}"
        parts.append(message)
        return "\t".join(parts).replace("\r", "").replace("\n", " | ")


class JsonFormatter(logging.Formatter):
    """istiod's ``--log_as_json`` line: ``{"level":...,"time":...,"scope":...,"caller":...,"msg":...}``."""

    def __init__(self, scopes: _Scopes | None = None) -> None:
        super().__init__()
        self.scopes = scopes or _Scopes()

    def format(self, record: logging.LogRecord) -> str:
        scope, caller, stack_at = self.scopes.of(record.name)
        # istiod's (zap's) key order.
        out: dict[str, str] = {"level": _level_name(record), "time": _timestamp(record.created)}
        if scope != DEFAULT_SCOPE:
            out["scope"] = scope
        if caller:
            out["caller"] = _caller(record)
        message = record.getMessage()
        if record.exc_info:
            message = f"{message}\n{self.formatException(record.exc_info)}"
        out["msg"] = message
        if record.levelno >= stack_at:
            out["stack"] = _stack()
        return orjson.dumps(out).decode()


def _handler(target: str) -> logging.Handler:
    if target == "stdout":
        return logging.StreamHandler(sys.stdout)
    if target == "stderr":
        return logging.StreamHandler(sys.stderr)
    path = Path(target)
    if path.parent != Path() and not path.parent.is_dir():
        os.makedirs(path.parent, exist_ok=True)
    return logging.FileHandler(path, encoding="utf-8")


def configure(level: str | LogOptions = "info") -> list[str]:
    """Set up logging; a bare level sets every scope. Returns scopes named that nobody logs in (the
    caller says so once logging is up). ValueError on a level or target that cannot be used."""
    options = level if isinstance(level, LogOptions) else LogOptions(level=level)
    if options.level not in LEVELS:
        raise ValueError(f"unknown log level {options.level!r} (one of {', '.join(LEVELS)})")
    scopes = _Scopes(options.callers, options.stacktrace_levels)
    formatter: logging.Formatter = JsonFormatter(scopes) if options.as_json else OneLineFormatter(scopes)
    handlers = []
    for target in options.targets or ("stderr",):
        try:
            handler = _handler(target)
        except OSError as err:
            raise ValueError(f"cannot log to {target}: {err.strerror or err}") from None
        handler.setFormatter(formatter)
        handlers.append(handler)
    levels = options.scope_levels()
    root = logging.getLogger()
    replaced, root.handlers[:] = root.handlers[:], handlers
    for old in replaced:
        old.close()  # a file target's file; streams stay open
    # Loggers outside meshpilot (aiohttp, asyncio) are in the default scope.
    root.setLevel(LEVELS[levels[DEFAULT_SCOPE]])
    for prefix, scope in SCOPES.items():
        logging.getLogger(prefix).setLevel(LEVELS[levels[scope]])
    # aiohttp's access log is chatty at info.
    logging.getLogger("aiohttp.access").setLevel(max(logging.WARNING, root.level))
    _configured[0] = options
    return options.unknown_scopes()


#: What ``configure`` was given last (a push worker process sets up its logging the same way).
_configured: list[LogOptions] = [LogOptions()]


def configured() -> LogOptions:
    return _configured[0]


def _levels_arg(text: str) -> dict[str, str]:
    try:
        return parse_levels(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _bool_arg(text: str) -> bool:
    lowered = text.lower()
    if lowered in ("true", "t", "1"):
        return True
    if lowered in ("false", "f", "0"):
        return False
    raise argparse.ArgumentTypeError(f"not a boolean: {text!r}")


def add_log_flags(parser: argparse.ArgumentParser) -> None:
    """meshpilot's ``--log-level`` and istiod's ``--log_*`` flags (see the module's note)."""
    parser.add_argument(
        "--log-level",
        default="info",
        choices=sorted(LEVELS),
        help="every scope's log level (default info); --log_output_level then sets single scopes",
    )
    parser.add_argument(
        "--log_output_level",
        type=_levels_arg,
        default={},
        metavar="SCOPE:LEVEL,...",
        help="istiod's per-scope levels, e.g. ads:debug,default:info (a bare level is the default scope's; "
        f"scopes: {', '.join(sorted(_scopes()))}, all)",
    )
    parser.add_argument(
        "--log_as_json",
        type=_bool_arg,
        nargs="?",
        const=True,
        default=False,
        metavar="BOOL",
        help="one JSON object a line (istiod's keys: time, level, scope, caller, msg, stack)",
    )
    parser.add_argument(
        "--log_caller",
        type=parse_scopes,
        default=frozenset(),
        metavar="SCOPE,...",
        help="scopes (or all) whose lines name the file and line that logged them",
    )
    parser.add_argument(
        "--log_stacktrace_level",
        type=_levels_arg,
        default={},
        metavar="SCOPE:LEVEL,...",
        help="lines at this level or worse carry the stack (default none)",
    )
    parser.add_argument(
        "--log_target",
        action="append",
        default=None,
        metavar="PATH",
        help="stdout, stderr or a file; repeatable (default stderr)",
    )


def options_from(args: argparse.Namespace) -> LogOptions:
    """The ``LogOptions`` of flags added by ``add_log_flags``."""
    return LogOptions(
        level=args.log_level,
        levels=args.log_output_level,
        as_json=bool(args.log_as_json),
        callers=args.log_caller,
        stacktrace_levels=args.log_stacktrace_level,
        targets=tuple(args.log_target or ("stderr",)),
    )


def report_unknown_scopes(unknown: Iterable[str]) -> None:
    """Say once, at start, which scopes named in the flags nothing logs in."""
    for scope in unknown:
        logging.getLogger(__name__).warning("log scope %r: no such scope, its setting has no effect", scope)
