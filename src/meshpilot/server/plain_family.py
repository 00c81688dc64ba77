"""What plain-integer metric families share: their series by label values, checked as
prometheus-client checks them, and their registration (``counters``, ``histograms``)."""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import Generic, TypeVar

from prometheus_client.registry import Collector, CollectorRegistry

C = TypeVar("C")


class PlainFamily(Collector, Generic[C], abc.ABC):
    """A family of series of one kind (``C``), labelled or not: a labelled series appears with its
    first ``labels()`` call, an unlabelled family's one series from the start."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str]) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self._children: dict[tuple[str, ...], C] = {}

    @abc.abstractmethod
    def _new_child(self) -> C: ...

    def _register(self, registry: CollectorRegistry | None) -> None:
        """Called by subclasses once they are set up (collecting may start at once)."""
        if not self.labelnames:
            self._children[()] = self._new_child()
        if registry is not None:
            registry.register(self)

    def labels(self, *values: str, **named: str) -> C:
        """The series of these label values, by position or by name (not both), one for each label."""
        if values and named:
            raise ValueError("label values by position or by name, not both")
        names = self.labelnames
        if not names or (set(named) != set(names) if named else len(values) != len(names)):
            raise ValueError(f"{self.name} takes the labels {list(names)}")
        key = tuple(str(named[n]) for n in names) if named else tuple(str(v) for v in values)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = self._new_child()
        return child

    def _unlabelled(self, verb: str) -> C:
        """The one series of an unlabelled family."""
        if self.labelnames:
            raise ValueError(f"{self.name} is labelled: {verb} through labels()")
        return self._children[()]
