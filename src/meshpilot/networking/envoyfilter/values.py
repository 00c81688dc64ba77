"""EnvoyFilter patch values: a ``google.protobuf.Struct`` read as the Envoy message it patches.

istiod turns the Struct into JSON and reads it as the ``applyTo`` type, ignoring unknown fields
(a filter may be written for another Envoy version). Typed configs (``@type``) must name a type
meshpilot knows: the protobuf modules of ``xds-protos`` are imported on demand, by the package the
type name gives, so a Lua filter works without meshpilot importing every extension at start.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Iterator
from functools import lru_cache
from typing import Any

from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.listener.v3 import listener_components_pb2, listener_pb2
from envoy.config.route.v3 import route_components_pb2, route_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from google.protobuf import descriptor_pool, json_format
from google.protobuf.message import Message

from meshpilot._proto.istio.networking.v1alpha3 import envoy_filter_pb2

_ApplyTo = envoy_filter_pb2.EnvoyFilter.ApplyTo

#: The message each supported ``applyTo`` patches.
VALUE_TYPES: dict[int, type[Message]] = {
    _ApplyTo.CLUSTER: cluster_pb2.Cluster,
    _ApplyTo.LISTENER: listener_pb2.Listener,
    _ApplyTo.LISTENER_FILTER: listener_components_pb2.ListenerFilter,
    _ApplyTo.FILTER_CHAIN: listener_components_pb2.FilterChain,
    _ApplyTo.NETWORK_FILTER: listener_components_pb2.Filter,
    _ApplyTo.HTTP_FILTER: hcm_pb2.HttpFilter,
    _ApplyTo.ROUTE_CONFIGURATION: route_pb2.RouteConfiguration,
    _ApplyTo.VIRTUAL_HOST: route_components_pb2.VirtualHost,
    _ApplyTo.HTTP_ROUTE: route_components_pb2.Route,
}

#: Packages whose protobuf modules may be imported to read a typed config; nothing else is imported
#: on a name taken from config.
_PROTO_PACKAGES = ("envoy.", "xds.", "udpa.", "contrib.")


class BadValue(ValueError):
    """A patch value that is not a valid message of its type."""


def _type_urls(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        url = node.get("@type")
        if isinstance(url, str):
            yield url
        for value in node.values():
            yield from _type_urls(value)
    elif isinstance(node, list):
        for value in node:
            yield from _type_urls(value)


@lru_cache(maxsize=4096)
def knows_type(full_name: str) -> bool:
    """Whether the message ``full_name`` is known, importing its package's modules if need be."""
    pool = descriptor_pool.Default()
    try:
        pool.FindMessageTypeByName(full_name)
        return True
    except KeyError:
        pass
    package = full_name.rpartition(".")[0]
    if not package.startswith(_PROTO_PACKAGES):
        return False
    try:
        module = importlib.import_module(package)
    except ImportError:
        return False
    for info in pkgutil.iter_modules(getattr(module, "__path__", [])):
        if info.name.endswith("_pb2"):
            importlib.import_module(f"{package}.{info.name}")
    try:
        pool.FindMessageTypeByName(full_name)
        return True
    except KeyError:
        return False


def message_from_struct(apply_to: int, value: Any) -> Message:
    """The patch ``value`` (a Struct) as the message ``apply_to`` patches; BadValue if it is not one."""
    message_type = VALUE_TYPES[apply_to]
    data = json_format.MessageToDict(value, preserving_proto_field_name=True)
    for url in _type_urls(data):
        name = url.rpartition("/")[2]
        if not knows_type(name):
            raise BadValue(f"unknown type {url}")
    try:
        return json_format.ParseDict(data, message_type(), ignore_unknown_fields=True)
    except (json_format.ParseError, TypeError, ValueError) as err:
        raise BadValue(str(err)) from None
