"""Dispatch from a config's kind to its validator."""

from __future__ import annotations

from collections.abc import Callable

from meshpilot.config.errors import ValidationError
from meshpilot.config.validation.metadata import validate_metadata
from meshpilot.config.validation.report import Report
from meshpilot.model.config import Config
from meshpilot.model.kind import Kind

Validator = Callable[[Config, Report], None]

_VALIDATORS: dict[Kind, Validator] = {}


def register(kind: Kind) -> Callable[[Validator], Validator]:
    """Make the decorated function the validator of ``kind``."""

    def add(fn: Validator) -> Validator:
        _VALIDATORS[kind] = fn
        return fn

    return add


def check_config(config: Config) -> Report:
    """Every error and warning for ``config``, without raising.

    (istiod reports warnings alongside errors; ValidationError carries only
    the errors, so this is the way to see both.)
    """
    report = Report()
    validate_metadata(config, report)
    # A metadata problem stops validation there, as it does in istiod.
    if not report.errors:
        validator = _VALIDATORS.get(config.meta.kind)
        if validator is not None:
            validator(config, report)
    return report


def validate_config(config: Config) -> list[str]:
    """Errors raise ValidationError; the warnings are returned."""
    report = check_config(config)
    if report.errors:
        raise ValidationError(report.errors)
    return report.warnings
