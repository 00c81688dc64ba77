"""Merging a template's pod fragment into the pod, as Kubernetes' strategic merge patch does for the
fields a template touches: maps merge key by key; lists of named things (containers, volumes, env,
volume mounts, image pull secrets) merge by their key, unknown items appended in the fragment's order;
other lists and scalars are replaced."""

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
    out = copy.deepcopy(base)
    index = {item.get(merge_key): n for n, item in enumerate(out)}
    for item in patch:
        n = index.get(item.get(merge_key))
        if n is None:
            index[item.get(merge_key)] = len(out)
            out.append(copy.deepcopy(item))
        else:
            out[n] = merge(out[n], item)
    return out


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
