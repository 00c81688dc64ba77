"""Logging as istiod: scopes, per-scope levels, the line and JSON shapes, the --log_* flags."""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from meshpilot.server import logs


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    levels = {name: logging.getLogger(name).level for name in logs.SCOPES}
    yield
    for handler in root.handlers:
        handler.close()
    root.handlers[:] = handlers
    root.setLevel(level)
    for name, saved in levels.items():
        logging.getLogger(name).setLevel(saved)


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(exit_on_error=False)
    logs.add_log_flags(parser)
    return parser.parse_args(argv)


def test_scopes_by_longest_module_prefix() -> None:
    assert logs.scope_of("meshpilot.xds.server") == "ads"
    assert logs.scope_of("meshpilot.xds.delta_stream") == "delta"
    assert logs.scope_of("meshpilot.push.push_log") == "ads"
    assert logs.scope_of("meshpilot.push.jwks_resolver") == "model"
    assert logs.scope_of("meshpilot.registry.kube.controller") == "kube"
    assert logs.scope_of("meshpilot.networking.listener") == "default"
    assert logs.scope_of("aiohttp.server") == "default"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("debug", {"default": "debug"}),
        ("ads:debug,default:warn", {"ads": "debug", "default": "warn"}),
        ("all:error", {"all": "error"}),
        ("", {}),
    ],
)
def test_level_lists_parse_as_istiod_reads_them(text: str, expected: dict[str, str]) -> None:
    assert logs.parse_levels(text) == expected


@pytest.mark.parametrize("text", ["ads:loud", "a:b:c", "verbose"])
def test_bad_level_lists_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="invalid output level"):
        logs.parse_levels(text)
    with pytest.raises(argparse.ArgumentError):
        _parse(f"--log_output_level={text}")


def test_per_scope_levels_apply_to_the_scopes_loggers(tmp_path: Path) -> None:
    target = tmp_path / "out.log"
    args = _parse("--log_output_level=ads:debug,model:error", f"--log_target={target}")
    assert logs.configure(logs.options_from(args)) == []
    logging.getLogger("meshpilot.xds.server").debug("ads debug line")
    logging.getLogger("meshpilot.push.push_log").debug("push debug line")
    logging.getLogger("meshpilot.model.push_context").warning("model warning dropped")
    logging.getLogger("meshpilot.model.push_context").error("model error kept")
    logging.getLogger("meshpilot.networking.listener").debug("default debug dropped")
    logging.getLogger("meshpilot.networking.listener").info("default info kept")
    lines = target.read_text().splitlines()
    fields = [line.split("\t") for line in lines]
    assert [f[1:] for f in fields] == [
        ["debug", "ads", "ads debug line"],
        ["debug", "ads", "push debug line"],
        ["error", "model", "model error kept"],
        ["info", "default info kept"],  # the default scope is not named, as in istiod
    ]
    assert all(f[0].endswith("Z") and len(f[0]) == 27 for f in fields)


def test_a_bare_level_is_the_default_scopes_and_all_overrides() -> None:
    levels = logs.LogOptions(levels=logs.parse_levels("debug")).scope_levels()
    assert levels["default"] == "debug" and levels["ads"] == "info"
    levels = logs.LogOptions(levels=logs.parse_levels("ads:debug,all:warn,kube:error")).scope_levels()
    assert levels["ads"] == "warn" and levels["kube"] == "error" and levels["default"] == "warn"
    # meshpilot's own --log-level sets every scope, then istiod's list refines it.
    levels = logs.LogOptions(level="debug", levels={"ads": "info"}).scope_levels()
    assert levels["model"] == "debug" and levels["ads"] == "info"


def test_json_lines_caller_and_stack(tmp_path: Path) -> None:
    target = tmp_path / "out.json"
    args = _parse(
        "--log_as_json",
        "--log_caller=ads",
        "--log_stacktrace_level=ads:error",
        f"--log_target={target}",
    )
    logs.configure(logs.options_from(args))
    logging.getLogger("meshpilot.xds.server").info("hello %s", "there")
    logging.getLogger("meshpilot.xds.server").error("broken")
    logging.getLogger("meshpilot.networking.listener").info("plain")
    first, second, third = (json.loads(line) for line in target.read_text().splitlines())
    assert list(first) == ["level", "time", "scope", "caller", "msg"]  # istiod's keys, in its order
    assert (first["level"], first["scope"], first["msg"]) == ("info", "ads", "hello there")
    assert first["caller"].startswith("server/test_logs.py:")
    assert "test_json_lines_caller_and_stack" in second["stack"] and second["level"] == "error"
    assert "stack" not in first
    assert third == {"time": third["time"], "level": "info", "msg": "plain"}


def test_log_as_json_takes_istiods_boolean_spellings() -> None:
    assert _parse("--log_as_json=false").log_as_json is False
    assert _parse("--log_as_json=true").log_as_json is True
    assert _parse().log_as_json is False


def test_several_targets_and_unknown_scopes(tmp_path: Path) -> None:
    one, two = tmp_path / "a" / "one.log", tmp_path / "two.log"
    args = _parse(f"--log_target={one}", f"--log_target={two}", "--log_output_level=krt:debug,nosuch:info")
    # krt is istiod's (nothing logs there here: accepted quietly); nosuch is nobody's.
    assert logs.configure(logs.options_from(args)) == ["nosuch"]
    logging.getLogger("meshpilot.kube.controller").warning("both")
    assert one.read_text().endswith("\twarn\tkube\tboth\n") and two.read_text() == one.read_text()


def test_an_unusable_target_is_a_clear_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ValueError, match="cannot log to"):
        logs.configure(logs.LogOptions(targets=(str(blocker / "x.log"),)))
