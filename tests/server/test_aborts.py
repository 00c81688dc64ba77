"""``clear_abort_frames``: an abort's chain lets go of the returned frames' variables."""

from __future__ import annotations

import weakref

import pytest
from support.held import collector_off

from meshpilot.server.aborts import clear_abort_frames


class Held:
    """A value a frame names, watched through a weak reference."""


def _raise_with(held: Held, message: str) -> None:
    raise ValueError(message)


def _abort_after(cause_value: Held, context_value: Held) -> None:
    """Raises LookupError from one exception while handling another, so that its ``__cause__`` and
    ``__context__`` differ."""
    try:
        _raise_with(cause_value, "cause")
    except ValueError as err:
        cause = err
    try:
        _raise_with(context_value, "handled")
    except ValueError:
        raise LookupError("abort") from cause


def test_the_frames_of_both_the_cause_and_the_context_let_go() -> None:
    cause_value, context_value = Held(), Held()
    refs = weakref.ref(cause_value), weakref.ref(context_value)
    with collector_off():
        with pytest.raises(LookupError) as caught:
            _abort_after(cause_value, context_value)
        err = caught.value
        assert err.__cause__ is not err.__context__
        del cause_value, context_value
        assert all(ref() is not None for ref in refs), "the frames hold them until cleared"
        clear_abort_frames(err)
        assert [ref() for ref in refs] == [None, None]


def test_a_cycle_in_the_chain_ends_the_walk() -> None:
    first, second = ValueError("first"), ValueError("second")
    first.__context__, second.__context__ = second, first
    clear_abort_frames(first)  # returns: each exception is visited once


def test_a_failure_is_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    class Unwalkable(Exception):
        @property
        def __traceback__(self) -> None:  # type: ignore[override]
            raise RuntimeError("no traceback here")

    clear_abort_frames(Unwalkable())
    assert "could not clear the frames" in caplog.text
