"""EnvoyFilter patches that failed on a proxy's generated config, or that a proxy they select does
not take, logged once and counted.

istiod logs a failing patch and sends the rest of the config; so does meshpilot. A merge of a typed
config into one of another type (a panic istiod recovers from by dropping every later patch of the
listener or cluster list) fails only the one patch here. Proxyless gRPC clients take no patches (as
with istiod's grpcgen). Counted in ``meshpilot_envoyfilter_problems_total{kind="EnvoyFilter",name}``.
"""

from __future__ import annotations

from meshpilot.networking.policy_problems import PolicyProblems

PATCH_PROBLEMS = PolicyProblems(
    "meshpilot_envoyfilter_problems",
    "EnvoyFilter patches that failed on generated config, or that a selected proxy does not take"
    " (meshpilot only).",
)


def patch_failed(filter_name: str, message: str) -> None:
    """One failure of a patch of the EnvoyFilter ``filter_name`` (``namespace/name``)."""
    PATCH_PROBLEMS.record("EnvoyFilter", filter_name, message)
