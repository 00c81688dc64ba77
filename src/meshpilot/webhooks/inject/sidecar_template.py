"""The built-in ``sidecar`` template, written in Python: the pod fragment istiod's default
injection-template.yaml renders with the chart's values and sidecar injection without CNI, native
sidecars off."""

from __future__ import annotations

import copy
import ipaddress
from typing import Any

from meshpilot.input_limits import InputRejected, is_decimal, load_json
from meshpilot.webhooks.inject.config import InjectionError
from meshpilot.webhooks.inject.context import TemplateContext, clean_proxy_config
from meshpilot.webhooks.inject.gotemplate.encode import proto_json, to_json
from meshpilot.webhooks.inject.quantity import canonical_quantity

PROXY_NAME = "istio-proxy"
INIT_NAME = "istio-init"
RESOURCE_ANNOTATIONS = {
    ("requests", "cpu"): "sidecar.istio.io/proxyCPU",
    ("requests", "memory"): "sidecar.istio.io/proxyMemory",
    ("limits", "cpu"): "sidecar.istio.io/proxyCPULimit",
    ("limits", "memory"): "sidecar.istio.io/proxyMemoryLimit",
}
INTERCEPTION_MODES = ("REDIRECT", "TPROXY", "NONE")


def _check_ports(key: str, value: str, wildcard: bool) -> None:
    """istiod's validatePortList: comma-separated ports (``*`` where allowed); rejected otherwise."""
    if wildcard and value.strip() == "*":
        return
    for part in value.split(","):
        part = part.strip()
        if not part:
            continue
        if not is_decimal(part) or not 0 < int(part) <= 65535:
            raise InjectionError(f"annotation {key}: {part!r} is not a port number")


def _check_cidrs(key: str, value: str) -> None:
    """istiod's ValidateIncludeIPRanges/ExcludeIPRanges: ``*`` or comma-separated CIDRs."""
    if value.strip() == "*":
        return
    for part in value.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            ipaddress.ip_network(part, strict=False)
        except ValueError:
            raise InjectionError(f"annotation {key}: {part!r} is not an IP range (CIDR)") from None


def validate_annotations(ctx: TemplateContext) -> None:
    ann = ctx.annotations
    checks = {
        "traffic.sidecar.istio.io/includeInboundPorts": True,
        "traffic.sidecar.istio.io/excludeInboundPorts": False,
        "traffic.sidecar.istio.io/includeOutboundPorts": False,
        "traffic.sidecar.istio.io/excludeOutboundPorts": False,
    }
    for key, wildcard in checks.items():
        if key in ann:
            _check_ports(key, ann[key], wildcard)
    for key in (
        "traffic.sidecar.istio.io/includeOutboundIPRanges",
        "traffic.sidecar.istio.io/excludeOutboundIPRanges",
    ):
        if key in ann:
            _check_cidrs(key, ann[key])
    mode = interception_mode(ctx)
    if mode not in INTERCEPTION_MODES:
        raise InjectionError(f"interception mode {mode!r} is not one of {', '.join(INTERCEPTION_MODES)}")


def interception_mode(ctx: TemplateContext) -> str:
    return ctx.annotation(
        "sidecar.istio.io/interceptionMode", ctx.proxy_config.get("interceptionMode", "REDIRECT")
    )


def hold_application(ctx: TemplateContext) -> bool:
    return bool(
        ctx.proxy_config.get("holdApplicationUntilProxyStarts")
        or ctx.values["global"]["proxy"].get("holdApplicationUntilProxyStarts")
    )


def exclude_inbound_ports(status_port: str, excluded: str) -> str:
    """The template's ``excludeInboundPort``: the agent's status port joins the excluded ports once."""
    status_port = status_port.strip()
    if not status_port or status_port == "0":
        return excluded
    ports = []
    for port in excluded.split(","):
        if port == status_port:
            return excluded
        if port.strip():
            ports.append(port.strip())
    ports.append(status_port)
    return ",".join(ports)


def _resources(ctx: TemplateContext) -> dict[str, Any]:
    ann = ctx.annotations
    if not any(key in ann for key in RESOURCE_ANNOTATIONS.values()):
        return copy.deepcopy(ctx.values["global"]["proxy"].get("resources") or {})
    out: dict[str, dict[str, str]] = {}
    for (group, resource), key in RESOURCE_ANNOTATIONS.items():
        if key in ann:
            out.setdefault(group, {})[resource] = canonical_quantity(ann[key], f"annotation {key}")
    return out


IMAGE_TYPES = ("distroless", "debug")


def image_reference(ctx: TemplateContext, image: str, image_type: str = "") -> str:
    """The image: the ``sidecar.istio.io/proxyImage`` annotation when it is a reference, else
    hub/image:tag with the image type (``image_type``, else ``global.variant``, the
    ``sidecar.istio.io/proxyImageType`` annotation over both) as the tag's suffix, as istiod's
    ProxyImage; type ``default`` means the plain tag."""
    override = ctx.annotations.get("sidecar.istio.io/proxyImage", image)
    if "/" in override:
        return override
    glob = ctx.values["global"]
    tag = str(glob["tag"])
    kind = ctx.annotations.get(
        "sidecar.istio.io/proxyImageType", image_type or str(glob.get("variant") or "")
    )
    if kind:
        for known in IMAGE_TYPES:
            if tag.endswith("-" + known):
                tag = tag[: -len(known) - 1]
                break
        if kind != "default":
            tag = f"{tag}-{kind}"
    return f"{glob['hub']}/{image}:{tag}"


def proxy_image(ctx: TemplateContext) -> str:
    """The proxy's image, whose type the effective proxy config's ``image.imageType`` may set."""
    image_type = str((ctx.proxy_config.get("image") or {}).get("imageType") or "")
    return image_reference(ctx, ctx.values["global"]["proxy"]["image"], image_type)


def app_containers(pod: dict[str, Any]) -> list[str]:
    return [
        c.get("name", "")
        for c in (pod.get("spec") or {}).get("containers") or []
        if c.get("name") != PROXY_NAME
    ]


def _canonical_name(ctx: TemplateContext) -> str:
    labels = ctx.labels
    name = (
        labels.get("service.istio.io/canonical-name")
        or labels.get("app.kubernetes.io/name")
        or labels.get("app")
        or ctx.workload.name
    )
    return name[:63].strip("-_.")


def _pod_ports(pod: dict[str, Any]) -> str:
    """ISTIO_META_POD_PORTS as the template lays it out: one Go-marshalled ContainerPort per line."""
    lines = ["["]
    first = True
    for container in (pod.get("spec") or {}).get("containers") or []:
        for port in container.get("ports") or []:
            # Go's field order for ContainerPort, empty fields omitted.
            fields = {
                k: port[k] for k in ("name", "hostPort", "containerPort", "protocol", "hostIP") if port.get(k)
            }
            if not fields:
                continue
            body = ",".join(f'"{k}":{to_json(v)}' for k, v in fields.items())
            lines.append("    " + ("" if first else ",") + "{" + body + "}")
            first = False
    lines.append("]")
    return "\n".join(lines)


def _field_env(name: str, path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def _resource_env(name: str, resource: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"resourceFieldRef": {"resource": resource, "divisor": "1"}}}


def _init_container(ctx: TemplateContext, mode: str) -> dict[str, Any]:
    proxy = ctx.values["global"]["proxy"]
    ann = ctx.annotation
    status_port = ann("status.sidecar.istio.io/port", proxy["statusPort"])
    excluded = exclude_inbound_ports(
        status_port, ann("traffic.sidecar.istio.io/excludeInboundPorts", proxy["excludeInboundPorts"])
    )
    args = [
        "istio-iptables",
        "-p", "15001",
        "-z", "15006",
        "-u", "1337",
        "-m", mode,
        "-i", ann("traffic.sidecar.istio.io/includeOutboundIPRanges", proxy["includeIPRanges"]),
        "-x", ann("traffic.sidecar.istio.io/excludeOutboundIPRanges", proxy["excludeIPRanges"]),
        "-b", ann("traffic.sidecar.istio.io/includeInboundPorts", proxy["includeInboundPorts"]),
        "-d", f"15090,15021,{excluded}" if excluded else "15090,15021",
    ]  # fmt: skip
    for flag, key, value_key in (
        ("-q", "traffic.sidecar.istio.io/includeOutboundPorts", "includeOutboundPorts"),
        ("-o", "traffic.sidecar.istio.io/excludeOutboundPorts", "excludeOutboundPorts"),
    ):
        if key in ctx.annotations or proxy.get(value_key):
            args += [flag, ann(key, proxy.get(value_key, ""))]
    if "istio.io/reroute-virtual-interfaces" in ctx.annotations:
        args += ["-k", ctx.annotations["istio.io/reroute-virtual-interfaces"]]
    elif "traffic.sidecar.istio.io/kubevirtInterfaces" in ctx.annotations:
        args += ["-k", ctx.annotations["traffic.sidecar.istio.io/kubevirtInterfaces"]]
    if "traffic.sidecar.istio.io/excludeInterfaces" in ctx.annotations:
        args += ["-c", ctx.annotations["traffic.sidecar.istio.io/excludeInterfaces"]]
    args.append(
        "--log_output_level="
        + ann("sidecar.istio.io/agentLogLevel", ctx.values["global"]["logging"]["level"])
    )
    init: dict[str, Any] = {
        "name": INIT_NAME,
        "image": image_reference(ctx, ctx.values["global"]["proxy_init"]["image"]),
        "args": args,
    }
    if ctx.values["global"].get("imagePullPolicy"):
        init["imagePullPolicy"] = ctx.values["global"]["imagePullPolicy"]
    metadata_env = ctx.proxy_config.get("proxyMetadata") or {}
    if metadata_env:
        init["env"] = [{"name": k, "value": str(v)} for k, v in sorted(metadata_env.items())]
    init["resources"] = _resources(ctx)
    privileged = bool(proxy["privileged"])
    init["securityContext"] = {
        "allowPrivilegeEscalation": privileged,
        "privileged": privileged,
        "capabilities": {"add": ["NET_ADMIN", "NET_RAW"], "drop": ["ALL"]},
        "readOnlyRootFilesystem": False,
        "runAsGroup": 0,
        "runAsNonRoot": False,
        "runAsUser": 0,
    }
    return init


def _proxy_env(ctx: TemplateContext, mode: str) -> list[dict[str, Any]]:
    glob = ctx.values["global"]
    ca_addr = glob.get("caAddress") or (
        "istiod"
        + (f"-{ctx.values['revision']}" if ctx.values.get("revision") else "")
        + f".{glob['istioNamespace']}.svc:15012"
    )
    env: list[dict[str, Any]] = [
        {"name": "PILOT_CERT_PROVIDER", "value": glob["pilotCertProvider"]},
        {"name": "CA_ADDR", "value": ca_addr},
        _field_env("POD_NAME", "metadata.name"),
        _field_env("POD_NAMESPACE", "metadata.namespace"),
        _field_env("INSTANCE_IP", "status.podIP"),
        _field_env("SERVICE_ACCOUNT", "spec.serviceAccountName"),
        _field_env("HOST_IP", "status.hostIP"),
        _resource_env("ISTIO_CPU_LIMIT", "limits.cpu"),
        {"name": "PROXY_CONFIG", "value": proto_json(clean_proxy_config(ctx.proxy_config)) + "\n"},
        {"name": "ISTIO_META_POD_PORTS", "value": _pod_ports(ctx.pod)},
        {"name": "ISTIO_META_APP_CONTAINERS", "value": ",".join(app_containers(ctx.pod))},
        _resource_env("GOMEMLIMIT", "limits.memory"),
        # The agent is Go in istiod's image: Istio 1.31's template caps its threads by the CPU limit too.
        _resource_env("GOMAXPROCS", "limits.cpu"),
        {"name": "ISTIO_META_CLUSTER_ID", "value": glob["multiCluster"].get("clusterName") or "Kubernetes"},
        _field_env("ISTIO_META_NODE_NAME", "spec.nodeName"),
        {"name": "ISTIO_META_INTERCEPTION_MODE", "value": mode},
    ]
    if glob.get("network"):
        env.append({"name": "ISTIO_META_NETWORK", "value": glob["network"]})
    workload_name = ctx.labels.get("service.istio.io/workload-name") or ctx.workload.name
    if workload_name:
        env.append({"name": "ISTIO_META_WORKLOAD_NAME", "value": workload_name})
    w = ctx.workload
    if w.api_version and w.name:
        namespace = w.namespace or "default"
        owner = f"kubernetes://apis/{w.api_version}/namespaces/{namespace}/{w.kind.lower()}s/{w.name}"
        env.append({"name": "ISTIO_META_OWNER", "value": owner})
    trust_domain = ctx.values["meshConfig"].get("trustDomain") or glob.get("trustDomain") or ""
    mesh_id = glob.get("meshID") or trust_domain
    if mesh_id:
        env.append({"name": "ISTIO_META_MESH_ID", "value": mesh_id})
    if trust_domain:
        env.append({"name": "TRUST_DOMAIN", "value": trust_domain})
    for key, value in sorted((ctx.proxy_config.get("proxyMetadata") or {}).items()):
        env.append({"name": key, "value": str(value)})
    # Go leaves an empty value out when it writes the pod.
    return [{k: v for k, v in e.items() if not (k == "value" and v == "")} for e in env]


def _user_entries(ctx: TemplateContext, key: str) -> list[dict[str, Any]]:
    """``sidecar.istio.io/userVolume`` / ``userVolumeMount``: JSON maps of name to volume (mount),
    added in name order as the template's range over a map does."""
    text = ctx.annotations.get(key)
    if text is None:
        return []
    try:
        data = load_json(str(text), f"annotation {key}")
    except InputRejected as err:
        raise InjectionError(str(err)) from None
    if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
        raise InjectionError(f"annotation {key}: expected a JSON object of name to object")
    return [{"name": name, **spec} for name, spec in sorted(data.items())]


def _proxy_container(ctx: TemplateContext, mode: str) -> dict[str, Any]:
    glob = ctx.values["global"]
    proxy = glob["proxy"]
    ann = ctx.annotation
    container: dict[str, Any] = {
        "name": PROXY_NAME,
        "image": proxy_image(ctx),
        "ports": [{"containerPort": 15090, "protocol": "TCP", "name": "http-envoy-prom"}],
        "args": [
            "proxy",
            "sidecar",
            "--domain",
            f"$(POD_NAMESPACE).svc.{proxy['clusterDomain']}",
            "--proxyLogLevel=" + ann("sidecar.istio.io/logLevel", proxy["logLevel"]),
            "--proxyComponentLogLevel="
            + ann("sidecar.istio.io/componentLogLevel", proxy["componentLogLevel"]),
            "--log_output_level=" + ann("sidecar.istio.io/agentLogLevel", glob["logging"]["level"]),
        ],
    }
    if hold_application(ctx):
        container["lifecycle"] = {"postStart": {"exec": {"command": ["pilot-agent", "wait"]}}}
    container["env"] = _proxy_env(ctx, mode)
    if glob.get("imagePullPolicy"):
        container["imagePullPolicy"] = glob["imagePullPolicy"]
    if ann("status.sidecar.istio.io/port", proxy["statusPort"]) != "0":
        if proxy["startupProbe"].get("enabled"):
            container["startupProbe"] = {
                "httpGet": {"path": "/healthz/ready", "port": 15021},
                "periodSeconds": 1,
                "timeoutSeconds": 3,
                "failureThreshold": int(proxy["startupProbe"]["failureThreshold"]),
            }
        readiness: dict[str, Any] = {"httpGet": {"path": "/healthz/ready", "port": 15021}}
        for field, key, value_key in (
            ("initialDelaySeconds", "initialDelaySeconds", "readinessInitialDelaySeconds"),
            ("periodSeconds", "periodSeconds", "readinessPeriodSeconds"),
            ("failureThreshold", "failureThreshold", "readinessFailureThreshold"),
        ):
            text = ann(f"readiness.status.sidecar.istio.io/{key}", proxy[value_key])
            if not is_decimal(text.removeprefix("-")):
                raise InjectionError(
                    f"annotation readiness.status.sidecar.istio.io/{key}: {text!r} is not an integer"
                )
            if int(text):  # Go drops zero-valued probe fields when it marshals the pod.
                readiness[field] = int(text)
        readiness["timeoutSeconds"] = 3
        container["readinessProbe"] = readiness
    privileged = bool(proxy["privileged"])
    security: dict[str, Any] = {"allowPrivilegeEscalation": privileged, "privileged": privileged}
    if mode == "TPROXY":
        security |= {
            "capabilities": {"add": ["NET_ADMIN"], "drop": ["ALL"]},
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": False,
            "runAsUser": 0,
            "runAsGroup": 1337,
        }
    else:
        security |= {
            "capabilities": {"drop": ["ALL"]},
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "runAsUser": 1337,
            "runAsGroup": 1337,
        }
    container["securityContext"] = security
    container["resources"] = _resources(ctx)
    mounts = [
        ("workload-socket", "/var/run/secrets/workload-spiffe-uds"),
        ("credential-socket", "/var/run/secrets/credential-uds"),
        ("workload-certs", "/var/run/secrets/workload-spiffe-credentials"),
    ]
    if glob["pilotCertProvider"] == "istiod":
        mounts += [
            ("istiod-ca-cert", "/var/run/secrets/istio"),
            ("istio-ca-crl", "/var/run/secrets/istio/crl"),
        ]
    mounts += [
        ("istio-data", "/var/lib/istio/data"),
        ("istio-envoy", "/etc/istio/proxy"),
        ("istio-token", "/var/run/secrets/tokens"),
        ("istio-podinfo", "/etc/istio/pod"),
    ]
    container["volumeMounts"] = [{"name": name, "mountPath": path} for name, path in mounts]
    container["volumeMounts"] += _user_entries(ctx, "sidecar.istio.io/userVolumeMount")
    return container


def _volumes(ctx: TemplateContext) -> list[dict[str, Any]]:
    glob = ctx.values["global"]
    volumes: list[dict[str, Any]] = [
        # The chart writes ``emptyDir:`` with no value, which decodes to an unset source.
        {"name": "workload-socket"},
        {"name": "credential-socket"},
        {"name": "workload-certs"},
        {"name": "istio-envoy", "emptyDir": {"medium": "Memory"}},
        {"name": "istio-data", "emptyDir": {}},
        {
            "name": "istio-podinfo",
            "downwardAPI": {
                "items": [
                    {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}},
                    {"path": "annotations", "fieldRef": {"fieldPath": "metadata.annotations"}},
                ]
            },
        },
        {
            "name": "istio-token",
            "projected": {
                "sources": [
                    {
                        "serviceAccountToken": {
                            "path": "istio-token",
                            "expirationSeconds": 43200,
                            "audience": glob["sds"]["token"]["aud"],
                        }
                    }
                ]
            },
        },
    ]
    if glob["pilotCertProvider"] == "istiod":
        volumes.append(
            {
                "name": "istiod-ca-cert",
                "configMap": {"name": glob.get("trustBundleName") or "istio-ca-root-cert"},
            }
        )
    volumes.append({"name": "istio-ca-crl", "configMap": {"name": "istio-ca-crl", "optional": True}})
    return volumes + _user_entries(ctx, "sidecar.istio.io/userVolume")


def render_sidecar(ctx: TemplateContext) -> dict[str, Any]:
    """The pod fragment to merge into the pod (its annotations already validated)."""
    mode = interception_mode(ctx)
    labels = ctx.labels
    annotations: dict[str, str] = {"istio.io/rev": ctx.revision}
    apps = app_containers(ctx.pod)
    if apps:
        for key in (
            "kubectl.kubernetes.io/default-logs-container",
            "kubectl.kubernetes.io/default-container",
        ):
            if key not in ctx.annotations:
                annotations[key] = apps[0]
    spec: dict[str, Any] = {}
    # With interception off and no native sidecar, the template asks for no init container at all.
    spec["initContainers"] = [] if mode == "NONE" else [_init_container(ctx, mode)]
    spec["containers"] = [_proxy_container(ctx, mode)]
    spec["volumes"] = _volumes(ctx)
    pull_secrets = ctx.values["global"].get("imagePullSecrets") or []
    if pull_secrets:
        spec["imagePullSecrets"] = [{"name": str(s)} for s in pull_secrets]
    return {
        "metadata": {
            "labels": {
                "security.istio.io/tlsMode": labels.get("security.istio.io/tlsMode") or "istio",
                "service.istio.io/canonical-name": _canonical_name(ctx),
                "service.istio.io/canonical-revision": labels.get("service.istio.io/canonical-revision")
                or labels.get("app.kubernetes.io/version")
                or labels.get("version")
                or "latest",
            },
            "annotations": annotations,
        },
        "spec": spec,
    }
