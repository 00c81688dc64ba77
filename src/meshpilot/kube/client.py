"""Clients of the Kubernetes API: from a kubeconfig file, a kubeconfig text, or in-cluster credentials.

Everything goes through the official ``kubernetes`` client's ApiClient (its
configuration, authentication and connection pool); requests are sent with
``call_api`` and bodies are read raw, so 10,000 pods are parsed once by orjson
instead of being turned into model classes and back into dicts.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import orjson
import urllib3
import yaml
from kubernetes import client as kclient
from kubernetes import config as kconfig
from kubernetes.config.config_exception import ConfigException

POOL_SIZE = 64


class KubeError(Exception):
    """A request the API server refused, or that could not be sent."""

    def __init__(self, message: str, status: int = 0, reason: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason


def in_cluster() -> bool:
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST"))


def _configuration() -> kclient.Configuration:
    configuration = kclient.Configuration()
    # One connection per informer's watch plus requests: urllib3's default pool of 10 would
    # discard connections and reconnect all the time.
    configuration.connection_pool_maxsize = POOL_SIZE
    return configuration


def client_from_kubeconfig(path: Path | None, context: str | None = None) -> kclient.ApiClient:
    """The client for ``--kubeconfig``, else in-cluster credentials, else ``$KUBECONFIG``/~/.kube/config."""
    configuration = _configuration()
    try:
        if path is None and in_cluster():
            kconfig.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        else:
            kconfig.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=str(path) if path is not None else None,
                context=context,
                client_configuration=configuration,
            )
    except (ConfigException, OSError, yaml.YAMLError) as err:
        raise KubeError(f"cannot load kubeconfig {path or '(default)'}: {err}") from None
    return kclient.ApiClient(configuration)


def client_from_kubeconfig_text(text: str | bytes) -> kclient.ApiClient:
    """A client for a kubeconfig held in a Secret (a remote cluster)."""
    configuration = _configuration()
    try:
        document = yaml.safe_load(text)
        if not isinstance(document, dict):
            raise KubeError("kubeconfig is not a YAML mapping")
        kconfig.load_kube_config_from_dict(  # type: ignore[no-untyped-call]
            document, client_configuration=configuration
        )
    except (ConfigException, yaml.YAMLError, TypeError, ValueError) as err:
        raise KubeError(f"invalid kubeconfig: {err}") from None
    return kclient.ApiClient(configuration)


def resource_path(group: str, version: str, plural: str, namespace: str = "", name: str = "") -> str:
    base = f"/api/{version}" if not group else f"/apis/{group}/{version}"
    if namespace:
        base += f"/namespaces/{namespace}"
    base += f"/{plural}"
    return f"{base}/{name}" if name else base


def open_request(
    api: kclient.ApiClient,
    method: str,
    path: str,
    *,
    query: list[tuple[str, Any]] | None = None,
    body: Any = None,
    content_type: str = "application/json",
    timeout: tuple[float, float] = (5.0, 30.0),
) -> urllib3.BaseHTTPResponse:
    """Send a request and return the open response (status checked), for streaming or reading."""
    headers = {"Accept": "application/json"}
    if body is not None:
        headers["Content-Type"] = content_type
    try:
        method, url, header_params, serialized, post = api.param_serialize(
            method,
            path,
            query_params=query or [],
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        response = api.call_api(
            method, url, header_params, serialized, post, _request_timeout=timeout
        ).response
    except (urllib3.exceptions.HTTPError, OSError, kclient.ApiException) as err:
        raise KubeError(f"{method} {path}: {err}") from None
    if response.status >= 300:
        data = response.data
        response.release_conn()
        message, reason = _status_message(data)
        raise KubeError(f"{method} {path}: {response.status} {message}", response.status, reason)
    opened: urllib3.BaseHTTPResponse = response
    return opened


def request_json(api: kclient.ApiClient, method: str, path: str, **options: Any) -> Any:
    """``open_request`` (same options), the whole body read and parsed."""
    response = open_request(api, method, path, **options)
    try:
        return orjson.loads(response.data)
    except orjson.JSONDecodeError as err:
        raise KubeError(f"{method} {path}: the response is not JSON: {err}") from None
    finally:
        response.release_conn()


def _status_message(data: bytes) -> tuple[str, str]:
    try:
        status = orjson.loads(data)
    except orjson.JSONDecodeError:
        return data[:200].decode("utf-8", "replace"), ""
    if isinstance(status, dict):
        return str(status.get("message", "")), str(status.get("reason", ""))
    return "", ""
