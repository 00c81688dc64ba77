"""``exportTo`` lists: which namespaces may see a config object."""

from __future__ import annotations

from collections.abc import Sequence

from meshpilot.config.validation.hosts import is_dns1123_label

_PRIVATE = "."
_PUBLIC = "*"
_NONE = "~"


def _visibility_error(entry: str) -> str | None:
    if entry in (_PRIVATE, _PUBLIC):
        return None
    if entry == _NONE:
        return "exportTo ~ (none) is not allowed for Istio configuration objects"
    if not is_dns1123_label(entry):
        return "only .,*, or a valid DNS 1123 label is allowed as exportTo entry"
    return None


def export_to_errors(
    namespace: str,
    export_to: Sequence[str],
    *,
    is_service_entry: bool = False,
    is_dr_with_selector: bool = False,
) -> list[str]:
    """Entries are ``.``, ``*``, namespaces (and ``~`` for ServiceEntry), without duplicates or
    contradictions."""
    if not export_to:
        return []
    errors = []
    seen: set[str] = set()
    for entry in export_to:
        # "." stands for the object's own namespace, so "." and that namespace are duplicates.
        key = namespace if entry == _PRIVATE else entry
        if key in seen:
            if key != entry:
                errors.append(f"duplicate entries in exportTo: . and current namespace {namespace}")
            else:
                errors.append(f"duplicate entries in exportTo for entry {entry}")
        elif is_service_entry and entry == _NONE:
            # A ServiceEntry may be visible only to the proxies of its own workloads.
            seen.add(key)
        else:
            problem = _visibility_error(key)
            if problem:
                errors.append(problem)
            else:
                seen.add(key)

    if is_dr_with_selector and seen:
        if namespace in seen:
            if len(seen) > 1:
                errors.append(
                    "destination rule with workload selector cannot have multiple entries in exportTo"
                )
        else:
            errors.append(
                "destination rule with workload selector cannot have exportTo beyond current namespace"
            )
    if _PUBLIC in seen and len(export_to) > 1:
        errors.append("cannot have both public (*) and non-public exportTo values for a resource")
    if _NONE in seen and len(export_to) > 1:
        errors.append("cannot export service entry to no one (~) and someone")
    return errors
