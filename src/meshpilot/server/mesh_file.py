"""The MeshConfig ``meshpilot discovery`` starts with: the file given, or istiod's defaults."""

from __future__ import annotations

from typing import Any

from meshpilot.config.errors import ConfigError
from meshpilot.model.mesh import apply_mesh_config, default_mesh_config
from meshpilot.server.settings import DiscoverySettings


def load_mesh_config(settings: DiscoverySettings) -> Any:
    if settings.mesh_config is None:
        return default_mesh_config()
    try:
        text = settings.mesh_config.read_text()
    except OSError as err:
        raise ConfigError(f"cannot read mesh config {settings.mesh_config}: {err.strerror or err}") from None
    try:
        return apply_mesh_config(text)
    except ConfigError as err:
        raise ConfigError(f"mesh config {settings.mesh_config}: {err}") from None
