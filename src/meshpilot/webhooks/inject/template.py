"""Choosing and rendering the injection templates.

istiod runs Go text/template (with sprig) over ``templates`` from its config. Python cannot run Go
templates, so:

* the built-in ``sidecar`` template is Python (``sidecar_template.py``) and is used for the name
  ``sidecar`` even when the config carries the chart's Go text for it (that text is the chart's default
  template, which the Python one reproduces);
* every other template is rendered with a small subset of Go's syntax:
  ``{{ .Path.To.Field }}`` and ``{{ index .Path "key" }}`` (with ``{{-``/``-}}`` whitespace trimming).
  Roots are ``.ObjectMeta``, ``.Spec``, ``.Values``, ``.ProxyConfig``, ``.DeploymentMeta``,
  ``.Revision``. Go's capitalised field names are looked up as written, then with a lower-case first
  letter (``.Spec.ServiceAccountName`` is ``spec.serviceAccountName``). Strings are inserted as they
  are; other values as JSON (which YAML reads back). A missing field inserts nothing.
  Any other action (``if``, ``range``, ``with``, pipes, functions, variables) is unsupported and fails
  the injection with an error naming the action, rather than injecting something else.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from meshpilot.webhooks.inject.config import InjectConfig, InjectionError
from meshpilot.webhooks.inject.context import TemplateContext, go_json
from meshpilot.webhooks.inject.sidecar_template import render_sidecar

TEMPLATES_ANNOTATION = "inject.istio.io/templates"
BUILTIN = {"sidecar": render_sidecar}

_ACTION = re.compile(r"(\s*)\{\{(-?)(.*?)(-?)\}\}(\s*)", re.DOTALL)
_PATH = re.compile(r"^\.[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_INDEX = re.compile(r'^index\s+(\.[A-Za-z0-9_.]+)\s+(?:"([^"]*)"|`([^`]*)`)$')


def template_names(ctx: TemplateContext, config: InjectConfig) -> list[str]:
    """The annotation's comma list, else the config's defaults; aliases expand to their templates."""
    raw = ctx.annotations.get(TEMPLATES_ANNOTATION)
    names = [n.strip() for n in raw.split(",") if n.strip()] if raw else list(config.default_templates)
    out: list[str] = []
    for name in names:
        out.extend(config.aliases.get(name, (name,)))
    return out


def _root(ctx: TemplateContext) -> dict[str, Any]:
    metadata = ctx.pod.get("metadata") or {}
    w = ctx.workload
    return {
        "ObjectMeta": metadata,
        "Spec": ctx.pod.get("spec") or {},
        "Values": ctx.values,
        "ProxyConfig": ctx.proxy_config,
        "DeploymentMeta": {"name": w.name, "namespace": w.namespace},
        "Revision": ctx.revision,
    }


def _lookup(data: Any, path: str) -> Any:
    value: Any = data
    for part in path.strip(".").split("."):
        if not isinstance(value, dict):
            return None
        if part in value:
            value = value[part]
        else:
            value = value.get(part[:1].lower() + part[1:])
    return value


def _evaluate(action: str, root: dict[str, Any]) -> Any:
    action = action.strip()
    if _PATH.match(action):
        return _lookup(root, action)
    index = _INDEX.match(action)
    if index:
        container = _lookup(root, index.group(1))
        key = index.group(2) if index.group(2) is not None else index.group(3)
        return container.get(key) if isinstance(container, dict) else None
    raise InjectionError(
        f"template action {{{{ {action} }}}} is not supported: meshpilot renders only "
        '{{ .Field.Path }} and {{ index .Path "key" }} in user templates'
    )


def render_text(text: str, ctx: TemplateContext) -> str:
    root = _root(ctx)

    def substitute(match: re.Match[str]) -> str:
        lead, trim_left, action, trim_right, trail = match.groups()
        if action.strip().startswith("/*"):
            value: Any = None  # a comment
        else:
            value = _evaluate(action, root)
        if value is None:
            text_value = ""
        elif isinstance(value, str):
            text_value = value
        else:
            text_value = go_json(value)
        return ("" if trim_left else lead) + text_value + ("" if trim_right else trail)

    return _ACTION.sub(substitute, text)


def render_user_template(name: str, text: str, ctx: TemplateContext) -> dict[str, Any]:
    rendered = render_text(text, ctx)
    try:
        data = yaml.safe_load(rendered)
    except yaml.YAMLError as err:
        raise InjectionError(f"template {name!r} did not render to YAML: {err}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise InjectionError(f"template {name!r} must render to a pod (a mapping)")
    return data


def render_templates(ctx: TemplateContext, config: InjectConfig) -> list[dict[str, Any]]:
    """Each selected template's pod fragment, in order."""
    fragments = []
    for name in template_names(ctx, config):
        if name in BUILTIN:
            fragments.append(BUILTIN[name](ctx))
        elif name in config.templates:
            fragments.append(render_user_template(name, config.templates[name], ctx))
        else:
            raise InjectionError(f"requested template {name!r} is not in the injector config")
    return fragments
