"""Merging a template's pod fragment into the pod, as Kubernetes' strategic merge patch does for the
fields a template touches: maps merge key by key; lists of named things (containers, volumes, env,
volume mounts, image pull secrets) merge by their key; other lists and scalars are replaced."""

from __future__ import annotations

import copy
from typing import Any

from meshpilot.webhooks.inject.config import InjectionError

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
    for item in base + patch:
        if not isinstance(item.get(merge_key), (str, int, type(None))):
            raise InjectionError(
                f"{key}[].{merge_key} must be a string or a number, got {item.get(merge_key)!r}"
            )
    # Ordered as istiod's injected pods show: a patch item the base lacks goes ahead of the base's own
    # remaining items (the template's volumes before the pod's); items both have keep the base's order.
    base_index = {item.get(merge_key): n for n, item in enumerate(base)}
    patch_keys = {item.get(merge_key) for item in patch}
    server_only = [item for item in base if item.get(merge_key) not in patch_keys]
    merged_patch = [
        merge(base[base_index[i.get(merge_key)]], i) if i.get(merge_key) in base_index else copy.deepcopy(i)
        for i in patch
    ]
    out: list[Any] = []
    p = q = 0
    while p < len(merged_patch) and q < len(server_only):
        name = merged_patch[p].get(merge_key)
        if name not in base_index or base_index[name] < base_index[server_only[q].get(merge_key)]:
            out.append(merged_patch[p])
            p += 1
        else:
            out.append(copy.deepcopy(server_only[q]))
            q += 1
    return out + merged_patch[p:] + [copy.deepcopy(i) for i in server_only[q:]]


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
