"""exportTo: which namespaces see a service or config, with istiod's precedence rules.

istiod files every Service and VirtualService under "public", "private to its
namespace" or "exported to namespace N" once per push; the rules below are
those buckets read backwards.
"""

from __future__ import annotations

from collections.abc import Iterable

PUBLIC = "*"
PRIVATE = "."
NONE = "~"


def export_set(export_to: Iterable[str], default: Iterable[str]) -> frozenset[str]:
    """``export_to``, or the mesh default when it is empty.

    A mesh default is honoured only for ``.`` and ``*`` (private wins): any
    other default value exports to nobody, as istiod files such objects nowhere.
    An unset (empty) default is public.
    """
    values = frozenset(export_to)
    if values:
        return values
    defaults = frozenset(default)
    if not defaults:
        return frozenset({PUBLIC})
    if PRIVATE in defaults:
        return frozenset({PRIVATE})
    if PUBLIC in defaults:
        return frozenset({PUBLIC})
    return frozenset({NONE})


def visible_to(export_to: frozenset[str], owner_namespace: str, namespace: str) -> bool:
    """Whether something in ``owner_namespace`` exported to ``export_to`` is seen from ``namespace``.

    ``*`` exports to all and overrides everything else; otherwise ``~`` hides
    from everyone, whatever else is listed; ``.`` and the owner's own name mean
    the owner's namespace.
    """
    if PUBLIC in export_to:
        return True
    if NONE in export_to:
        return False
    if namespace == owner_namespace and PRIVATE in export_to:
        return True
    return namespace in export_to


def scope_rank(export_to: frozenset[str], owner_namespace: str, namespace: str) -> int:
    """Where istiod lists a visible object for ``namespace``: 0 private, 1 exported to it, 2 public.

    Sidecar scopes take services and VirtualServices in this order, so a
    namespace's own objects come before exported and public ones.
    """
    if PUBLIC in export_to:
        return 2
    if namespace == owner_namespace and (PRIVATE in export_to or owner_namespace in export_to):
        return 0
    return 1
