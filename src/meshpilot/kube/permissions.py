"""What meshpilot asks of the Kubernetes API, in one place.

Each :class:`Permission` is one API group and resource, the verbs meshpilot's kube code sends for it, and
where: in every namespace (a ClusterRole) or only in the Istio namespace (a Role there). The RBAC objects
under ``deploy/`` grant exactly these and the deploy tests check them against the real API server with a
SubjectAccessReview per verb, and against istiod's own ClusterRole and Role (nothing broader).

The watched kinds, the status subresources, the webhook configurations and the Leases are taken from the
constants the code itself reads (``KubeSource``'s kinds, ``WebhookKind``, the Leases), so a kind
added there shows up here, and in the deploy tests' review, without an edit. The verbs are those of the
code's requests: an informer lists and watches (``GET`` with and without ``watch``), a create is
``POST``, an update ``PUT``, a status write ``PATCH``.

Remote clusters are read with the credentials of their multicluster Secret, not these.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from meshpilot.config.schemas import SCHEMAS
from meshpilot.kube.leader import NAMESPACE_CONTROLLER_LEASE, STATUS_LEASE
from meshpilot.kube.source import CONFIG_KINDS, REGISTRY_KINDS, SECRET_KINDS
from meshpilot.kube.webhook_ca import WebhookKind

__all__ = [
    "ENABLE_STATUS",
    "PERMISSIONS",
    "Permission",
    "Scope",
    "expand",
]

#: An informer's verbs.
_READ = ("list", "watch")
#: The setting that needs the status subresources (istiod's chart grants them with enableAnalysis).
ENABLE_STATUS = "--enable-status (PILOT_ENABLE_STATUS=true)"


class Scope(enum.Enum):
    CLUSTER = "cluster"
    ISTIO_NAMESPACE = "istio-namespace"


@dataclass(frozen=True, slots=True)
class Permission:
    group: str
    resource: str
    verbs: tuple[str, ...]
    scope: Scope
    why: str
    #: The setting that needs it; "" when meshpilot always does.
    only_with: str = ""


def _watched() -> Iterator[Permission]:
    for kind in (*REGISTRY_KINDS, *CONFIG_KINDS, *SECRET_KINDS):
        schema = SCHEMAS[kind]
        why = "SDS credentials (credentialName)" if kind in SECRET_KINDS else f"watches {kind.value}"
        yield Permission(schema.group, schema.plural, _READ, Scope.CLUSTER, why)


def _status() -> Iterator[Permission]:
    for kind in CONFIG_KINDS:
        schema = SCHEMAS[kind]
        yield Permission(
            schema.group,
            f"{schema.plural}/status",
            ("patch",),
            Scope.CLUSTER,
            "status.observedGeneration, by the leader",
            ENABLE_STATUS,
        )


def _webhooks() -> Iterator[Permission]:
    for kind in WebhookKind:
        yield Permission(
            "admissionregistration.k8s.io",
            kind.value,
            (*_READ, "update"),
            Scope.CLUSTER,
            "keeps caBundle of the istio.io/rev webhook configurations",
        )


PERMISSIONS: tuple[Permission, ...] = (
    *_watched(),
    Permission(
        "",
        "configmaps",
        (*_READ, "create", "get", "update"),
        Scope.CLUSTER,
        "istio-ca-root-cert in every namespace; the istio mesh ConfigMap",
    ),
    *_webhooks(),
    Permission("authentication.k8s.io", "tokenreviews", ("create",), Scope.CLUSTER, "the CA's callers"),
    Permission(
        "authorization.k8s.io",
        "subjectaccessreviews",
        ("create",),
        Scope.CLUSTER,
        "may a proxy's service account read a credentialName Secret",
    ),
    Permission(
        "",
        "secrets",
        ("get", "create"),
        Scope.ISTIO_NAMESPACE,
        "the CA's key: cacerts read, istio-ca-secret read or made",
    ),
    Permission(
        "coordination.k8s.io",
        "leases",
        ("get", "create", "update"),
        Scope.ISTIO_NAMESPACE,
        f"leader election (Leases {STATUS_LEASE}, {NAMESPACE_CONTROLLER_LEASE})",
    ),
    *_status(),
)


def expand(permissions: Iterable[Permission]) -> set[tuple[str, str, str]]:
    """(group, resource, verb) of each verb."""
    return {(p.group, p.resource, verb) for p in permissions for verb in p.verbs}
