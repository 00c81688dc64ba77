"""One generator per xDS type, keyed by TypeUrl."""

from __future__ import annotations

from meshpilot.xds.generators.base import GenerationContext, Generator, Resource
from meshpilot.xds.generators.cds import ClusterGenerator
from meshpilot.xds.generators.eds import EndpointGenerator
from meshpilot.xds.generators.grpc import GrpcClusterGenerator, GrpcListenerGenerator, GrpcRouteGenerator
from meshpilot.xds.generators.lds import ListenerGenerator
from meshpilot.xds.generators.rds import RouteGenerator
from meshpilot.xds.generators.sds import SecretGenerator
from meshpilot.xds.types import TypeUrl


def sidecar_generators(secrets: SecretGenerator | None = None) -> dict[TypeUrl, Generator]:
    """The default generators; SDS only when given (it needs the Secrets and who may read them)."""
    out: dict[TypeUrl, Generator] = {
        TypeUrl.CLUSTER: ClusterGenerator(),
        TypeUrl.ENDPOINT: EndpointGenerator(),
        TypeUrl.LISTENER: ListenerGenerator(),
        TypeUrl.ROUTE: RouteGenerator(),
    }
    if secrets is not None:
        out[TypeUrl.SECRET] = secrets
    return out


def generators_by_metadata() -> dict[str, dict[TypeUrl, Generator]]:
    """Generators a proxy selects with node metadata ``GENERATOR``, tried before the default ones.

    istiod looks up ``GENERATOR + "/" + typeURL`` first; proxyless gRPC
    (``grpc``) gets its own listeners, clusters and routes, and the default EDS.
    """
    return {
        "grpc": {
            TypeUrl.CLUSTER: GrpcClusterGenerator(),
            TypeUrl.LISTENER: GrpcListenerGenerator(),
            TypeUrl.ROUTE: GrpcRouteGenerator(),
        }
    }


__all__ = [
    "GenerationContext",
    "Generator",
    "Resource",
    "SecretGenerator",
    "generators_by_metadata",
    "sidecar_generators",
]
