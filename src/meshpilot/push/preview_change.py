"""The change a preview is asked about: read from YAML or JSON and validated as the webhook would.

Each object goes through the validating webhook's own handler (``webhooks.validate``), so a change
the API server would refuse is refused here with the message it would show; the handler counts into
a registry of its own, since a preview is not an admission review. Only Istio config can be
previewed: Kubernetes objects come from the registries, which a preview does not copy. Deleting
is asked for the whole change at once (``delete=True``): each object then needs only its kind,
apiVersion and metadata.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from meshpilot.config.decode import decode_object, identify
from meshpilot.config.documents import parse_text
from meshpilot.config.errors import ConfigError
from meshpilot.config.schemas import SCHEMAS
from meshpilot.config.store import ConfigStore, same
from meshpilot.model.config import Config, ConfigKey
from meshpilot.model.kind import Kind
from meshpilot.server.metrics import Metrics
from meshpilot.webhooks.validate import ValidationHandler


class PreviewError(ValueError):
    """The change cannot be read at all (not a YAML or JSON stream of objects)."""


@dataclass(frozen=True, slots=True)
class ObjectChange:
    """One object of the change and what it does to the current config."""

    kind: str
    namespace: str
    name: str
    #: "add", "update", "delete" or "unchanged" (the same spec, labels and annotations).
    change: str

    def as_json(self) -> dict[str, str]:
        return {"kind": self.kind, "namespace": self.namespace, "name": self.name, "change": self.change}


@dataclass(slots=True)
class Change:
    """A validated change: objects to write, keys to delete, and what was wrong with the rest."""

    upserts: list[Config] = field(default_factory=list)
    deletes: list[ConfigKey] = field(default_factory=list)
    objects: list[ObjectChange] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def valid(self) -> bool:
        return not self.errors


class ChangeReader:
    """Reads a change body and validates each object as the validating webhook would."""

    def __init__(self) -> None:
        # A registry of its own: previews are not admission reviews, so they must not move
        # galley_validation_* on the server's /metrics.
        self._validator = ValidationHandler(Metrics())

    def read(
        self, body: bytes, store: ConfigStore, *, delete: bool = False, default_namespace: str = "default"
    ) -> Change:
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError:
            raise PreviewError("the change is not UTF-8 text") from None
        docs = parse_text(text, "change", json=text.lstrip().startswith(("{", "[")))
        if not docs:
            raise PreviewError("the change holds no objects")
        change = Change()
        for doc in docs:
            if doc.error is not None or doc.raw is None:
                change.errors.append(f"{doc.where}: {doc.error}")
                continue
            kind, namespace, name = identify(doc.raw)
            where = f"{kind or '?'} {namespace or default_namespace}/{name or '?'}"
            try:
                istio_kind = _istio_kind(doc.raw)
            except ConfigError as err:
                change.errors.append(f"{where}: {err}")
                continue
            key = ConfigKey(istio_kind, name, namespace or default_namespace)
            if delete:
                self._delete(key, store, where, change)
            else:
                self._upsert(doc.raw, key, store, where, change)
        return change

    def _upsert(
        self, raw: dict[str, Any], key: ConfigKey, store: ConfigStore, where: str, change: Change
    ) -> None:
        kind, namespace = key.kind, key.namespace
        exists = store.get(kind, key.name, namespace) is not None
        review = self._validator(
            {
                "operation": "UPDATE" if exists else "CREATE",
                "object": raw,
                "namespace": namespace,
                "dryRun": True,
                "kind": {"kind": kind.value},
            }
        )
        if not review.get("allowed"):
            change.errors.append(f"{where}: {review.get('status', {}).get('message', 'refused')}")
            return
        # The webhook admitted it, so it decodes; the Config is what the loader would store.
        config = decode_object(raw, default_namespace=namespace).obj
        assert isinstance(config, Config)
        change.warnings.extend(f"{where}: {w}" for w in review.get("warnings", ()))
        old = store.get(kind, config.name, config.namespace)
        if old is None:
            verb = "add"
        elif same(old, config):  # the store's own test: such an update raises no event
            verb = "unchanged"
        else:
            verb = "update"
            # The store keeps an object's age across updates: conflicts (oldest wins) stay resolved
            # as they are now.
            if not config.meta.creation_timestamp and old.meta.creation_timestamp:
                config = Config(
                    dataclasses.replace(config.meta, creation_timestamp=old.meta.creation_timestamp),
                    config.spec,
                    config.spec_hash,
                )
        change.upserts.append(config)
        change.objects.append(ObjectChange(kind.value, config.namespace, config.name, verb))

    def _delete(self, key: ConfigKey, store: ConfigStore, where: str, change: Change) -> None:
        if not key.name:
            change.errors.append(f"{where}: metadata.name is required to delete an object")
            return
        if store.get(key.kind, key.name, key.namespace) is None:
            change.errors.append(f"{where}: no such object to delete")
            return
        change.deletes.append(key)
        change.objects.append(ObjectChange(key.kind.value, key.namespace, key.name, "delete"))


def _istio_kind(raw: dict[str, Any]) -> Kind:
    """The Istio kind ``raw`` names; ConfigError for anything else (Kubernetes objects come from
    the registries, which a preview does not copy)."""
    kind, api_version = raw.get("kind"), raw.get("apiVersion")
    if not isinstance(kind, str) or not isinstance(api_version, str):
        raise ConfigError("apiVersion and kind are required")
    group = api_version.rpartition("/")[0]
    for schema in SCHEMAS.values():
        if schema.kind.is_istio and schema.kind.value == kind and schema.group == group:
            return schema.kind
    raise ConfigError(f"only Istio config can be previewed, not {group or 'core'}/{kind}")
