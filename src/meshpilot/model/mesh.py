"""MeshConfig: istiod's defaults, and user YAML applied over them as istiod applies it."""

from __future__ import annotations

from typing import Any

import yaml
from google.protobuf.message import Message

from meshpilot._proto.istio.mesh.v1alpha1 import config_pb2, proxy_pb2
from meshpilot.config.errors import ConfigError
from meshpilot.config.protojson import parse_spec

MeshConfig = config_pb2.MeshConfig
ProxyConfig = proxy_pb2.ProxyConfig

ALLOW_ANY = config_pb2.MeshConfig.OutboundTrafficPolicy.ALLOW_ANY
REGISTRY_ONLY = config_pb2.MeshConfig.OutboundTrafficPolicy.REGISTRY_ONLY


def default_proxy_config() -> Any:
    pc = ProxyConfig(
        config_path="./etc/istio/proxy",
        service_cluster="istio-proxy",
        proxy_admin_port=15000,
        control_plane_auth_policy=proxy_pb2.AuthenticationPolicy.MUTUAL_TLS,
        discovery_address="istiod.istio-system.svc:15012",
        binary_path="/usr/local/bin/envoy",
        stat_name_length=189,
        status_port=15020,
    )
    pc.drain_duration.FromSeconds(45)
    pc.termination_drain_duration.FromSeconds(5)
    return pc


def default_mesh_config() -> Any:
    """istiod's ``DefaultMeshConfig``."""
    mc = MeshConfig(
        enable_tracing=True,
        access_log_encoding=MeshConfig.TEXT,
        ingress_service="istio-ingressgateway",
        ingress_controller_mode=MeshConfig.STRICT,
        ingress_class="istio",
        trust_domain="cluster.local",
        root_namespace="istio-system",
        proxy_listen_port=15001,
        proxy_inbound_listen_port=15006,
        default_service_export_to=["*"],
        default_virtual_service_export_to=["*"],
        default_destination_rule_export_to=["*"],
    )
    mc.protocol_detection_timeout.FromSeconds(0)
    mc.enable_auto_mtls.value = True
    mc.outbound_traffic_policy.mode = ALLOW_ANY
    mc.inbound_traffic_policy.mode = MeshConfig.InboundTrafficPolicy.PASSTHROUGH
    mc.locality_lb_setting.enabled.value = True
    mc.default_config.CopyFrom(default_proxy_config())
    mc.connect_timeout.FromSeconds(10)
    mc.dns_refresh_rate.FromSeconds(60)
    mc.enable_prometheus_merge.value = True
    mc.default_providers.SetInParent()
    providers = mc.extension_providers
    providers.add(name="prometheus").prometheus.SetInParent()
    providers.add(name="stackdriver").stackdriver.SetInParent()
    providers.add(name="envoy").envoy_file_access_log.path = "/dev/stdout"
    return mc


def _merge(target: Message, source: Message, data: dict[str, Any]) -> None:
    """Set on ``target`` every field ``data`` names, taking values from ``source``.

    Singular message fields merge field by field (as Go's jsonpb does when it
    decodes into an existing message); scalars, lists and maps are replaced.
    """
    descriptor = target.DESCRIPTOR
    for key, value in data.items():
        field = descriptor.fields_by_camelcase_name.get(key) or descriptor.fields_by_name[key]
        name = field.name
        if value is None:
            target.ClearField(name)
        elif field.is_repeated:
            target.ClearField(name)
            getattr(target, name).MergeFrom(getattr(source, name))
        elif field.message_type is not None and not field.message_type.full_name.startswith(
            "google.protobuf."
        ):
            if isinstance(value, dict):
                _merge(getattr(target, name), getattr(source, name), value)
            else:
                getattr(target, name).CopyFrom(getattr(source, name))
        elif field.message_type is not None:
            getattr(target, name).CopyFrom(getattr(source, name))
        else:
            setattr(target, name, getattr(source, name))


def apply_mesh_config(text: str, base: Any | None = None) -> Any:
    """MeshConfig from YAML over ``base`` (istiod's defaults when None).

    Fields override the defaults, except ``defaultConfig`` and
    ``defaultProviders`` (merged), ``extensionProviders`` (merged by name) and
    ``trustDomainAliases`` (united). ConfigError on unknown fields or bad values.
    """
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ConfigError(f"invalid YAML: {err}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError("mesh config must be a YAML object")
    user = MeshConfig()
    parse_spec(data, user, path="mesh")
    mc = MeshConfig()
    mc.CopyFrom(base if base is not None else default_mesh_config())
    previous_providers = list(mc.extension_providers)
    previous_aliases = set(mc.trust_domain_aliases)
    _merge(mc, user, data)
    if "extensionProviders" in data or "extension_providers" in data:
        merged = {p.name: p for p in previous_providers}
        order = [p.name for p in previous_providers]
        for p in user.extension_providers:
            if p.name not in merged:
                order.append(p.name)
            merged[p.name] = p
        mc.ClearField("extension_providers")
        mc.extension_providers.extend(merged[name] for name in order)
    mc.ClearField("trust_domain_aliases")
    mc.trust_domain_aliases.extend(sorted(previous_aliases | set(user.trust_domain_aliases)))
    return mc
