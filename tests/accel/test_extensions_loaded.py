"""With a compiled build, every hot path must run compiled: a silent fallback fails here."""

from __future__ import annotations

import importlib
import os

import pytest

from meshpilot._ext import SELECTORS


@pytest.mark.parametrize("selector", SELECTORS)
def test_compiled_modules_loaded_when_expected(selector: str) -> None:
    if os.environ.get("MESHPILOT_EXPECT_EXTENSIONS") != "1":
        pytest.skip("MESHPILOT_EXPECT_EXTENSIONS is not set")
    module = importlib.import_module(selector)
    expected = "py" if os.environ.get("MESHPILOT_NO_EXTENSIONS") else "c"
    assert expected == module.IMPLEMENTATION, f"{selector} runs {module.IMPLEMENTATION}"
    compiled = importlib.import_module(f"meshpilot._ext.{selector.rsplit('.', 1)[1]}")
    assert compiled.__name__.startswith("meshpilot._ext.")
