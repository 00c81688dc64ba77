"""exportTo rules as istiod applies them to services and VirtualServices."""

from __future__ import annotations

import pytest

from meshpilot.model.visibility import export_set, scope_rank, visible_to


@pytest.mark.parametrize(
    ("export_to", "default", "expected"),
    [
        ([], ["*"], {"*"}),
        ([], ["."], {"."}),
        ([], [".", "*"], {"."}),
        ([], [], {"*"}),
        ([], ["other"], {"~"}),
        (["a", "b"], ["."], {"a", "b"}),
    ],
)
def test_mesh_defaults_apply_only_when_unset_and_only_dot_or_star(export_to, default, expected) -> None:
    assert export_set(export_to, default) == frozenset(expected)


@pytest.mark.parametrize(
    ("export_to", "owner", "viewer", "visible"),
    [
        ({"*"}, "a", "b", True),
        ({"."}, "a", "a", True),
        ({"."}, "a", "b", False),
        ({"b"}, "a", "b", True),
        ({"b"}, "a", "a", False),
        ({"a"}, "a", "a", True),
        ({"~"}, "a", "a", False),
        ({"~", "b"}, "a", "b", False),
        ({"*", "~"}, "a", "b", True),
    ],
)
def test_visibility(export_to, owner, viewer, visible) -> None:
    assert visible_to(frozenset(export_to), owner, viewer) is visible


def test_rank_puts_private_before_exported_before_public() -> None:
    assert scope_rank(frozenset({"."}), "a", "a") == 0
    assert scope_rank(frozenset({"a", "b"}), "a", "a") == 0
    assert scope_rank(frozenset({"a", "b"}), "a", "b") == 1
    assert scope_rank(frozenset({"*"}), "a", "a") == 2
