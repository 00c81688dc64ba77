"""Whether a pod gets a sidecar: istiod's ``injectRequired`` (pkg/kube/inject/inject.go)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from meshpilot.model.label_selector import SelectorError, is_empty, label_selector_matches
from meshpilot.webhooks.inject.config import InjectConfig, InjectionError

INJECT_KEY = "sidecar.istio.io/inject"
STATUS_ANNOTATION = "sidecar.istio.io/status"


def selector_matches(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """A Kubernetes LabelSelector against a label set; an empty selector matches nothing here,
    because istiod skips empty selectors in the inject lists."""
    if is_empty(selector):
        return False
    try:
        return label_selector_matches(selector, labels)
    except SelectorError as err:
        raise InjectionError(str(err)) from None


def injection_required(pod: Mapping[str, Any], namespace: str, config: InjectConfig) -> bool:
    """istiod's decision for one pod. ``namespace`` is the pod's (or the request's when the pod has none)."""
    spec = pod.get("spec") or {}
    metadata = pod.get("metadata") or {}
    if spec.get("hostNetwork"):
        # iptables rules would change the node's routing, not the pod's.
        return False
    if namespace in config.ignored_namespaces:
        return False
    annotations: Mapping[str, str] = metadata.get("annotations") or {}
    labels: Mapping[str, str] = metadata.get("labels") or {}
    if STATUS_ANNOTATION in annotations:
        # Already injected: a second pass would duplicate the sidecar.
        return False
    # The label is the newer API, so it wins over the annotation of the same name.
    choice = labels[INJECT_KEY] if INJECT_KEY in labels else annotations.get(INJECT_KEY, "")
    explicit: bool | None = {"true": True, "false": False}.get(choice)
    # Anything other than "true"/"false" falls back to the selectors and the policy, as in istiod.
    if explicit is None:
        for selector in config.never_inject_selector:
            if selector_matches(selector, labels):
                explicit = False
                break
    if explicit is None:
        for selector in config.always_inject_selector:
            if selector_matches(selector, labels):
                explicit = True
                break
    if config.policy == "enabled":
        return True if explicit is None else explicit
    if config.policy == "disabled":
        return False if explicit is None else explicit
    # istiod turns injection off on an unknown policy.
    return False
