"""Collects validation errors and warnings."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class Report:
    """The errors (the object is rejected) and warnings (accepted, but worth telling) found so far."""

    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def error(self, message: str) -> None:
        """Record an error."""
        self.errors.append(message)

    def warn(self, message: str) -> None:
        """Record a warning."""
        self.warnings.append(message)

    def check(self, message: str | None) -> None:
        """Record the result of a check that returns an error message or None."""
        if message is not None:
            self.errors.append(message)

    def extend(self, other: Report) -> None:
        """Take over another report's errors and warnings."""
        self.errors.extend(other.errors)
        self.warnings.extend(other.warnings)

    def extend_errors(self, other: Report) -> None:
        """Take over only another report's errors.

        istiod combines some sub-checks in a way that drops their warnings;
        this reproduces that, so the same warnings surface.
        """
        self.errors.extend(other.errors)
