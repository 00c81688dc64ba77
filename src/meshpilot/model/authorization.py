"""Which AuthorizationPolicies and RequestAuthentications apply to a workload, as istiod picks them.

istiod (``model/authorization.go``, ``policyattachment.go``) looks in the root namespace, then in
the workload's namespace, each oldest first (then by name). A policy applies when it has no
``targetRef(s)`` (those attach to Kubernetes Gateways and waypoints, never to a sidecar) and its
selector is absent or a subset of the workload's labels. A root-namespace policy with a selector
therefore applies to matching workloads of every namespace.
"""

from __future__ import annotations

from dataclasses import dataclass

from meshpilot.model.config import Config, ConfigKey
from meshpilot.model.kind import Kind
from meshpilot.model.labels import selector_matches
from meshpilot.model.proxy import Proxy
from meshpilot.model.push_context import PushContext

ALLOW = 0
DENY = 1
AUDIT = 2
CUSTOM = 3


@dataclass(frozen=True, slots=True)
class AuthorizationPolicies:
    """The policies applying to one workload, by action, each in istiod's order."""

    custom: tuple[Config, ...] = ()
    deny: tuple[Config, ...] = ()
    allow: tuple[Config, ...] = ()
    audit: tuple[Config, ...] = ()

    @property
    def empty(self) -> bool:
        return not (self.custom or self.deny or self.allow or self.audit)

    def fingerprint(self) -> tuple[tuple[ConfigKey, int, str], ...]:
        """What the generated filters read of these policies (annotations carry dry-run)."""
        return tuple(
            (c.key, c.spec_hash, repr(sorted(c.meta.annotations.items())))
            for group in (self.custom, self.deny, self.allow, self.audit)
            for c in group
        )


#: What applies to a workload no policy selects (most of a mesh's, on every full push).
NO_POLICIES = AuthorizationPolicies()


def _order(config: Config) -> tuple[str, str, str]:
    return (config.meta.creation_timestamp or "~", config.name, config.namespace)


def _attaches(config: Config, labels: dict[str, str]) -> bool:
    spec = config.spec
    if spec.HasField("targetRef") or len(spec.targetRefs) > 0:
        return False
    if not spec.HasField("selector"):
        return True
    return selector_matches(spec.selector.match_labels, labels)


def _candidates(push: PushContext, kind: Kind, namespace: str) -> tuple[Config, ...]:
    """The policies of ``kind`` in ``namespace``, in istiod's order: sorted once per snapshot, not per
    proxy (``push.configs`` scans every config of the kind)."""
    found: tuple[Config, ...] = push.memoized(
        ("policy-candidates", kind, namespace),
        lambda: tuple(sorted(push.configs(kind, namespace), key=_order)),
    )
    return found


def _selected(push: PushContext, kind: Kind, proxy: Proxy, namespaces: tuple[str, str]) -> list[Config]:
    out: list[Config] = []
    labels: dict[str, str] | None = None
    for namespace in dict.fromkeys(namespaces):
        configs = _candidates(push, kind, namespace)
        if configs:
            labels = dict(proxy.labels) if labels is None else labels
            out.extend(c for c in configs if _attaches(c, labels))
    return out


def authorization_policies(push: PushContext, proxy: Proxy) -> AuthorizationPolicies:
    """The AuthorizationPolicies that select ``proxy`` (istiod's ListAuthorizationPolicies)."""
    namespaces = (push.mesh.root_namespace, proxy.config_namespace)
    selected = _selected(push, Kind.AUTHORIZATION_POLICY, proxy, namespaces)
    if not selected:
        return NO_POLICIES
    by_action: dict[int, list[Config]] = {ALLOW: [], DENY: [], AUDIT: [], CUSTOM: []}
    for config in selected:
        by_action.setdefault(config.spec.action, []).append(config)
    return AuthorizationPolicies(
        custom=tuple(by_action[CUSTOM]),
        deny=tuple(by_action[DENY]),
        allow=tuple(by_action[ALLOW]),
        audit=tuple(by_action[AUDIT]),
    )


def request_authentications(push: PushContext, proxy: Proxy) -> tuple[Config, ...]:
    """The RequestAuthentications that select ``proxy`` (istiod's GetJwtPoliciesForWorkload: the
    workload's namespace first, then the root namespace)."""
    namespaces = (proxy.config_namespace, push.mesh.root_namespace)
    return tuple(_selected(push, Kind.REQUEST_AUTHENTICATION, proxy, namespaces))
