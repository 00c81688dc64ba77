"""One generator per xDS type, keyed by TypeUrl."""

from __future__ import annotations

from meshpilot.xds.generators.base import GenerationContext, Generator, Resource
from meshpilot.xds.generators.cds import ClusterGenerator
from meshpilot.xds.generators.eds import EndpointGenerator
from meshpilot.xds.generators.lds import ListenerGenerator
from meshpilot.xds.generators.rds import RouteGenerator
from meshpilot.xds.types import TypeUrl


def sidecar_generators() -> dict[TypeUrl, Generator]:
    return {
        TypeUrl.CLUSTER: ClusterGenerator(),
        TypeUrl.ENDPOINT: EndpointGenerator(),
        TypeUrl.LISTENER: ListenerGenerator(),
        TypeUrl.ROUTE: RouteGenerator(),
    }


__all__ = ["GenerationContext", "Generator", "Resource", "sidecar_generators"]
