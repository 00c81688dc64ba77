"""Telemetry providers (tracing, access logging) that could not be turned into Envoy config.

A provider whose collector Service is not in the registry, or of a kind meshpilot does not build,
changes what a proxy reports without anything failing, so each is logged once by provider name and
counted in ``meshpilot_telemetry_problems_total{kind,name}`` (``kind`` is the provider's type as
MeshConfig spells it, such as ``zipkin``; ``name`` the provider's name). A provider a Telemetry
object (or ``defaultProviders``) names and MeshConfig does not define is counted with ``kind``
``undefined``, once per snapshot for each set of Telemetry objects that names it, among the proxies
whose listener keys the snapshot works out (a sidecar keeps them while nothing they read changes:
``xds.generators.lds_keys``).
"""

from __future__ import annotations

from meshpilot.model import telemetry
from meshpilot.model.proxy import Proxy
from meshpilot.model.push_context import PushContext
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


def report_undefined(push: PushContext, proxy: Proxy) -> None:
    """Count the providers named in ``proxy``'s scope that MeshConfig lacks, once per snapshot and scope
    (asked where a proxy's listener keys are worked out)."""
    scope = telemetry.applicable(push, proxy)

    def record() -> bool:
        for field, name in telemetry.undefined_providers(push, proxy):
            TELEMETRY_PROBLEMS.record(
                "undefined",
                name,
                f"Telemetry {field} names provider {name!r}, which MeshConfig extensionProviders does not "
                "define; it is ignored (as istiod does)",
            )
        return True

    telemetry.derived(push, scope, "undefined-reported", record)
