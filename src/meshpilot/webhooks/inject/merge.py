"""Merging a template's pod fragment into the pod, as Kubernetes' strategic merge patch does for the
fields a template touches: maps merge key by key; lists of named things (containers, volumes, env,
volume mounts, image pull secrets) merge by their key; other lists and scalars are replaced."""

from __future__ import annotations

import copy
from typing import Any

# The patchMergeKey of the pod's merged lists (k8s.io/api/core/v1 types.go).
MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "volumes": "name",
    "env": "name",
    "volumeMounts": "mountPath",
    "imagePullSecrets": "name",
    "ports": "containerPort",
    "tolerations": "key",
    "hostAliases": "ip",
}


def _merge_list(key: str, base: list[Any], patch: list[Any]) -> list[Any]:
    merge_key = MERGE_KEYS.get(key)
    if merge_key is None or not all(isinstance(i, dict) for i in base + patch):
        return copy.deepcopy(patch)
    # The patch's items come first, in its order, then the items only the base has: the order
    # istiod's injected pods show (the template's volumes ahead of the pod's own).
    by_key = {item.get(merge_key): item for item in base}
    patched = [
        merge(by_key[i.get(merge_key)], i) if i.get(merge_key) in by_key else copy.deepcopy(i) for i in patch
    ]
    patch_keys = {i.get(merge_key) for i in patch}
    return patched + [copy.deepcopy(i) for i in base if i.get(merge_key) not in patch_keys]


def merge(base: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in patch.items():
        current = out.get(key)
        if value is None:
            # A null in a strategic merge patch deletes the field.
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(current, dict):
            out[key] = merge(current, value)
        elif isinstance(value, list) and isinstance(current, list):
            out[key] = _merge_list(key, current, value)
        else:
            out[key] = copy.deepcopy(value)
    return out
