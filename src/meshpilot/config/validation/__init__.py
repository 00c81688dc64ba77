"""Semantic validation of Istio config, as istiod (release 1.28) applies it.

``validate_config`` raises ValidationError with every error found, and
returns warnings (accepted, but worth telling the author). Message texts are
istiod's, since users and tools match on them.
"""

from __future__ import annotations

# Importing the kind modules registers their validators with the registry.
from meshpilot.config.validation import (  # noqa: F401
    destination_rule,
    gateway,
    security,
    service_entry,
    sidecar,
    telemetry,
    virtual_service,
    workload_entry,
)
from meshpilot.config.validation.mesh import validate_mesh_config
from meshpilot.config.validation.registry import check_config, validate_config

__all__ = ["check_config", "validate_config", "validate_mesh_config"]
