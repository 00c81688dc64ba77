"""The shared builder-test mesh as a fixture."""

from __future__ import annotations

import pytest
from support.mesh_objects import mesh_objects
from support.model import Model, build


@pytest.fixture
def model() -> Model:
    return build(mesh_objects())
