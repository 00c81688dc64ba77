"""istiod's own template functions (``pkg/kube/inject/template.go`` ``InjectionFuncmap``), applied
over sprig's as istiod does, so ``toYaml``, ``indent``, ``contains`` and ``omit`` are Istio's:
``toYaml`` keeps its trailing newline and ``indent`` leaves the first line alone."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from meshpilot.config.validation.formatting import go_duration
from meshpilot.input_limits import load_json
from meshpilot.webhooks.inject.context import clean_proxy_config
from meshpilot.webhooks.inject.gotemplate import GoStruct, StrMap
from meshpilot.webhooks.inject.gotemplate.convert import strval, to_int
from meshpilot.webhooks.inject.gotemplate.encode import proto_json, to_json, to_yaml
from meshpilot.webhooks.inject.gotemplate.values import sprint
from meshpilot.webhooks.inject.sidecar_template import PROXY_NAME, exclude_inbound_ports
from meshpilot.webhooks.inject.template_data import PROXY_CONFIG_TYPE


def _field(obj: Any, go_name: str, json_name: str) -> Any:
    if isinstance(obj, GoStruct):
        try:
            return obj.go_field(go_name)
        except KeyError:
            return None
    if isinstance(obj, Mapping):
        return obj.get(json_name)
    return None


def _str_map(value: Any) -> dict[str, str]:
    if isinstance(value, Mapping):
        return {str(k): strval(v) for k, v in value.items()}
    return {}


def format_duration(value: Any) -> str:
    """A protobuf Duration (protojson ``"90s"``) as Go's time.Duration prints it (``1m30s``)."""
    text = strval(value.to_plain() if isinstance(value, GoStruct) else value).strip()
    if not text or text == "<nil>":
        return "0s"
    seconds = float(text.removesuffix("s"))
    return go_duration(round(seconds * 1e9))


def isset(m: Any, key: Any) -> bool:
    return isinstance(m, Mapping) and key in m


def _container_ports(containers: Any, keep: Callable[[Any], bool]) -> str:
    parts: list[str] = []
    for container in containers or []:
        if not keep(container):
            continue
        for port in _field(container, "Ports", "ports") or []:
            if strval(_field(port, "Protocol", "protocol") or "") in ("UDP", "SCTP"):
                continue
            parts.append(str(to_int(_field(port, "ContainerPort", "containerPort"))))
    return ",".join(parts)


def include_inbound_ports(containers: Any) -> str:
    return _container_ports(containers, lambda _: True)


def application_ports(containers: Any) -> str:
    return _container_ports(containers, lambda c: _field(c, "Name", "name") != PROXY_NAME)


def annotation(meta: Any, name: Any, default: Any) -> str:
    annotations = _field(meta, "Annotations", "annotations") or {}
    if name in annotations:
        return strval(annotations[name])
    return sprint(default)


def value_or_default(value: Any, default: Any) -> Any:
    return default if value is None or value == "" else value


def _to_json_str_map(m: Any) -> str:
    return "{}" if m is None else to_json(_str_map(m))


def _from_json(text: Any) -> Any:
    try:
        return load_json(strval(text), "fromJSON")
    except ValueError:
        return "{}"


def _struct_to_json(value: Any) -> str:
    if value is None:
        return "{}"
    try:
        return to_json(value)
    except ValueError:
        return "{}"


def _proto_to_json(value: Any) -> str:
    """protomarshal.ToJSON of the message's set fields (the view holds exactly those, in proto order);
    a ProxyConfig loses its default-valued fields first, as istiod's protoToJSON cleans it."""
    if value is None or (isinstance(value, GoStruct) and not value):
        return "{}"
    plain = value.to_plain() if isinstance(value, GoStruct) else value
    if isinstance(value, GoStruct) and value.go_type() == "*" + PROXY_CONFIG_TYPE:
        plain = clean_proxy_config(dict(plain))
    return proto_json(plain)


def _istio_indent(spaces: Any, source: Any) -> str:
    pad = " " * to_int(spaces)
    lines = strval(source).split("\n")
    return "\n".join([lines[0], *(pad + line for line in lines[1:])])


def _istio_to_yaml(value: Any) -> str:
    try:
        return to_yaml(value)
    except ValueError:
        return ""


def _directory(path: Any) -> str:
    text = strval(path)
    return text[: text.rfind("/") + 1]


def append_multus_network(existing: Any, network: Any) -> str:
    """Adds the istio-cni network to a pod's ``k8s.v1.cni.cncf.io/networks`` value (a JSON list or
    a comma list) unless it is there already."""
    current, cni = strval(existing), strval(network)
    if current == "":
        return cni
    close = current.rfind("]")
    if close != -1:
        try:
            networks = load_json(current, "k8s.v1.cni.cncf.io/networks")
        except ValueError:
            return current
        namespace, _, name = cni.rpartition("/")
        for net in networks if isinstance(networks, list) else []:
            if (
                isinstance(net, Mapping)
                and net.get("name") == name
                and (net.get("namespace") or "") == namespace
            ):
                return current
        entry = f', {{"name": "{name}"}}'
        if namespace:
            entry = f', {{"name": "{name}", "namespace": "{namespace}"}}'
        return current[:close] + entry + current[close:]
    if any(part.strip() == cni for part in current.split(",")):
        return current
    return current + ", " + cni


def _omit(d: Any, *keys: Any) -> StrMap:
    dropped = {strval(k) for k in keys}
    return StrMap({k: v for k, v in _str_map(d).items() if k not in dropped})


def _strdict(*items: Any) -> StrMap:
    out = StrMap()
    for i in range(0, len(items), 2):
        out[strval(items[i])] = strval(items[i + 1]) if i + 1 < len(items) else ""
    return out


def merge_maps(*maps: Any) -> StrMap | None:
    if not maps:
        return None
    out = StrMap()
    for m in maps:
        out.update(_str_map(m))
    return out


def omit_nil(value: Any) -> Any:
    """Nil values dropped from maps and lists, recursively; a map or list left empty becomes nil."""
    if value is None:
        return None
    if isinstance(value, Mapping) and not isinstance(value, StrMap):
        if not _has_nil(value):
            return value
        out = {k: omit_nil(v) for k, v in value.items()}
        out = {k: v for k, v in out.items() if v is not None}
        return out or None
    if isinstance(value, list):
        if not _has_nil(value):
            return value
        items = [v for v in (omit_nil(v) for v in value) if v is not None]
        return items or None
    return value


def _has_nil(value: Any) -> bool:
    if value is None:
        return True
    if isinstance(value, Mapping) and not isinstance(value, StrMap):
        return any(_has_nil(v) for v in value.values())
    if isinstance(value, list):
        return any(_has_nil(v) for v in value)
    return False


def _image_tag_digest(image: str) -> tuple[str, str]:
    image, _, digest = image.partition("@")
    slash, colon = image.rfind("/"), image.rfind(":")
    return (image[colon + 1 :] if colon > slash else ""), digest


def otel_resource_attributes(
    mesh: Any, annotations: Any, labels: Any, namespace: Any, containers: Any
) -> str:
    """OTEL_RESOURCE_ATTRIBUTES when a mesh OpenTelemetry provider asks for semantic conventions."""
    providers = _field(mesh, "ExtensionProviders", "extensionProviders") or []
    enabled = False
    for provider in providers:
        otel = _field(provider, "Opentelemetry", "opentelemetry")
        if otel and strval(_field(otel, "ServiceAttributeEnrichment", "serviceAttributeEnrichment")) == (
            "OTEL_SEMANTIC_CONVENTIONS"
        ):
            enabled = True
            break
    if not enabled:
        return ""
    ann, lab, ns = _str_map(annotations), _str_map(labels), strval(namespace or "")
    containers = list(containers or [])
    attrs: list[str] = []
    if ann.get("resource.opentelemetry.io/service.namespace"):
        attrs.append("service.namespace=" + ann["resource.opentelemetry.io/service.namespace"])
    elif ns:
        attrs.append("service.namespace=" + ns)
    if ann.get("resource.opentelemetry.io/service.version"):
        attrs.append("service.version=" + ann["resource.opentelemetry.io/service.version"])
    elif lab.get("app.kubernetes.io/version"):
        attrs.append("service.version=" + lab["app.kubernetes.io/version"])
    elif len(containers) == 1:
        tag, digest = _image_tag_digest(strval(_field(containers[0], "Image", "image") or ""))
        version = f"{tag}@{digest}" if tag and digest else (digest or tag)
        if version:
            attrs.append("service.version=" + version)
    if ann.get("resource.opentelemetry.io/service.instance.id"):
        attrs.append("service.instance.id=" + ann["resource.opentelemetry.io/service.instance.id"])
    elif containers:
        attrs.append(f"service.instance.id={ns}.$(POD_NAME).{strval(_field(containers[0], 'Name', 'name'))}")
    return ",".join(attrs)


def injection_funcs(environ: Mapping[str, str]) -> dict[str, Callable[..., Any]]:
    """InjectionFuncmap; ``env`` reads ``environ`` (istiod's process environment)."""
    return {
        "formatDuration": format_duration,
        "isset": isset,
        "excludeInboundPort": lambda port, excluded: exclude_inbound_ports(sprint(port), strval(excluded)),
        "includeInboundPorts": include_inbound_ports,
        "kubevirtInterfaces": strval,
        "excludeInterfaces": strval,
        "applicationPorts": application_ports,
        "annotation": annotation,
        "valueOrDefault": value_or_default,
        "toJSON": _to_json_str_map,
        "fromJSON": _from_json,
        "structToJSON": _struct_to_json,
        "protoToJSON": _proto_to_json,
        "toYaml": _istio_to_yaml,
        "indent": _istio_indent,
        "directory": _directory,
        "contains": lambda needle, haystack: strval(needle) in strval(haystack),
        "toLower": lambda text: strval(text).lower(),
        "appendMultusNetwork": append_multus_network,
        "env": lambda key, default: environ.get(strval(key)) or strval(default),
        "omit": _omit,
        "strdict": _strdict,
        "toJsonMap": lambda *maps: to_json(merge_maps(*maps)),
        "mergeMaps": merge_maps,
        "omitNil": omit_nil,
        "otelResourceAttributes": otel_resource_attributes,
    }
