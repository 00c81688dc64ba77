"""What the kubelet gives a container that the tests start as a process: its environment."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any


def container_env(entries: Iterable[Mapping[str, Any]], pod_fields: Mapping[str, str]) -> dict[str, str]:
    """``env`` entries resolved: a value, a field of the pod (``pod_fields``, by path), or a CPU
    limit (GOMAXPROCS in Istio's chart), which with no limit set is the node's CPUs: this machine's."""
    out = {}
    for entry in entries:
        source = entry.get("valueFrom", {})
        if "value" in entry:
            out[entry["name"]] = str(entry["value"])
        elif "fieldRef" in source:
            out[entry["name"]] = pod_fields[source["fieldRef"]["fieldPath"]]
        else:
            assert source["resourceFieldRef"]["resource"] == "limits.cpu", entry
            out[entry["name"]] = str(os.cpu_count() or 1)
    return out
