"""Telemetry providers (tracing, access logging) that could not be turned into Envoy config.

A provider whose collector Service is not in the registry, or of a kind meshpilot does not build,
changes what a proxy reports without anything failing, so each is logged once by provider name and
counted in ``meshpilot_telemetry_problems_total{kind,name}`` (``kind`` is the provider's type as
MeshConfig spells it, such as ``zipkin``; ``name`` the provider's name).
"""

from __future__ import annotations

from meshpilot.networking.policy_problems import PolicyProblems

TELEMETRY_PROBLEMS = PolicyProblems(
    "meshpilot_telemetry_problems",
    "Telemetry providers (tracing, access logs) that could not be configured on a proxy (meshpilot only).",
)


def provider_problem(provider: object, message: str) -> None:
    """One occurrence of ``message`` about a MeshConfig extension provider."""
    kind = provider.WhichOneof("provider") or "unset"  # type: ignore[attr-defined]
    TELEMETRY_PROBLEMS.record(_camel(kind), provider.name, message)  # type: ignore[attr-defined]


def _camel(field: str) -> str:
    head, *rest = field.split("_")
    return head + "".join(part.capitalize() for part in rest)
