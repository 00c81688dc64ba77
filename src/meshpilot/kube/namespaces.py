"""Which namespaces are discovered: MeshConfig ``discoverySelectors`` over the Namespaces' labels.

As istiod's discovery namespace filter: with no selectors every namespace is
discovered; otherwise a namespace is when any selector matches its labels.
Cluster-scoped objects (Nodes, Namespaces) always pass.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from google.protobuf.json_format import MessageToDict

from meshpilot.model.label_selector import SelectorError, label_selector_matches

log = logging.getLogger(__name__)


def selectors_of(mesh: Any) -> list[dict[str, Any]]:
    """MeshConfig's discoverySelectors as Kubernetes LabelSelector dicts."""
    return [MessageToDict(s) for s in mesh.discovery_selectors]


class NamespaceFilter:
    def __init__(self, selectors: Sequence[Mapping[str, Any]] = ()) -> None:
        self._selectors = [dict(s) for s in selectors]
        self._labels: dict[str, dict[str, str]] = {}
        self._selected: set[str] = set()

    @property
    def active(self) -> bool:
        return bool(self._selectors)

    def allows(self, namespace: str) -> bool:
        return not namespace or not self._selectors or namespace in self._selected

    def differs(self, selectors: Sequence[Mapping[str, Any]]) -> bool:
        """Whether ``selectors`` are not the ones in force."""
        return [dict(s) for s in selectors] != self._selectors

    def set_selectors(self, selectors: Sequence[Mapping[str, Any]]) -> set[str]:
        """Replace the selectors; returns the namespaces whose membership changed."""
        if not self.differs(selectors):
            return set()
        new = [dict(s) for s in selectors]
        before = self._membership()
        self._selectors = new
        self._selected = {ns for ns, labels in self._labels.items() if self._matches(labels)}
        return _changed(before, self._membership())

    def set_namespace(self, name: str, labels: Mapping[str, str] | None) -> bool:
        """Record a Namespace's labels (None: deleted); True if its membership changed."""
        before = self.allows(name)
        if labels is None:
            self._labels.pop(name, None)
            self._selected.discard(name)
        else:
            self._labels[name] = dict(labels)
            if self._matches(labels):
                self._selected.add(name)
            else:
                self._selected.discard(name)
        return before != self.allows(name)

    def _membership(self) -> dict[str, bool]:
        return {ns: self.allows(ns) for ns in self._labels}

    def _matches(self, labels: Mapping[str, str]) -> bool:
        for selector in self._selectors:
            try:
                if label_selector_matches(selector, labels):
                    return True
            except SelectorError as err:
                log.error("meshConfig.discoverySelectors: %s; the selector is ignored", err)
        return False


def _changed(before: Mapping[str, bool], after: Mapping[str, bool]) -> set[str]:
    return {ns for ns in before.keys() | after.keys() if before.get(ns, True) != after.get(ns, True)}
