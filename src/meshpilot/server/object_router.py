"""Where the config sources' objects go in the model: Istio config, Secrets, Kubernetes objects."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from meshpilot.config.core_objects import KubeSecret
from meshpilot.config.decode import Decoded
from meshpilot.config.store import ConfigStore
from meshpilot.model.config import Config, ConfigKey
from meshpilot.model.credentials import CredentialStore
from meshpilot.model.kind import Kind
from meshpilot.registry.kube.controller import KubeRegistry


class ObjectRouter:
    """The sink of config sources: Istio config to the store, Secrets to the credentials SDS serves,
    other core objects to the Kubernetes registry."""

    def __init__(
        self, store: ConfigStore, kube: KubeRegistry, secrets: CredentialStore | None = None
    ) -> None:
        self.store = store
        self.kube = kube
        self.secrets = secrets if secrets is not None else CredentialStore()

    def upsert(self, obj: Decoded) -> None:
        if isinstance(obj, Config):
            self.store.upsert(obj)
        elif isinstance(obj, KubeSecret):
            self.secrets.upsert(obj)
        else:
            self.kube.upsert(obj)

    def remove(self, kind: Kind, namespace: str, name: str) -> None:
        if kind.is_istio:
            self.store.delete(ConfigKey(kind, name, namespace))
        elif kind is Kind.SECRET:
            self.secrets.remove(namespace, name)
        else:
            self.kube.remove(kind, namespace, name)

    @contextmanager
    def batch(self) -> Iterator[None]:
        with self.kube.batch(), self.store.batch():
            yield
