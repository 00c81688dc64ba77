"""Choosing and rendering the injection templates.

istiod parses each of the config's ``templates`` with Go's text/template, sprig's functions and its own
(``InjectionFuncmap``), executes it on ``SidecarTemplateData`` and reads the output as a YAML pod
fragment. meshpilot does the same with its Python port of text/template (``gotemplate/``): sprig's
functions in ``gotemplate/sprig.py``, Istio's over them in ``template_funcs.py``, the data in
``template_data.py`` (Go field names such as ``.Spec.ServiceAccountName`` or
``.ObjectMeta.Annotations`` map onto the pod's JSON there).

Every template the config names renders that way, ``sidecar`` included. Only when the config has no
``sidecar`` template (or there is no config) does ``sidecar`` mean the built-in Python template
(``sidecar_template.py``), which reproduces the chart's default. A template that fails to parse or
execute fails the injection with Go's message (``template: NAME:LINE: …``)."""

from __future__ import annotations

import functools
import os
from typing import Any

import yaml

from meshpilot.webhooks.inject.config import InjectConfig, InjectionError
from meshpilot.webhooks.inject.context import TemplateContext
from meshpilot.webhooks.inject.gotemplate import Template, TemplateError
from meshpilot.webhooks.inject.gotemplate.sprig import FUNCS as SPRIG_FUNCS
from meshpilot.webhooks.inject.sidecar_template import (
    image_reference,
    proxy_image,
    render_sidecar,
    validate_annotations,
)
from meshpilot.webhooks.inject.template_data import template_data
from meshpilot.webhooks.inject.template_funcs import injection_funcs

TEMPLATES_ANNOTATION = "inject.istio.io/templates"
BUILTIN = {"sidecar": render_sidecar}
# Istio's functions replace sprig's of the same name, as istiod's Funcs(sprig).Funcs(istio) does.
# ``env`` reads the process environment when it runs, as istiod's does.
FUNCS = {**SPRIG_FUNCS, **injection_funcs(os.environ)}


def template_names(ctx: TemplateContext, config: InjectConfig) -> list[str]:
    """The annotation's comma list, else the config's defaults; aliases expand to their templates."""
    raw = ctx.annotations.get(TEMPLATES_ANNOTATION)
    names = [n.strip() for n in raw.split(",") if n.strip()] if raw else list(config.default_templates)
    out: list[str] = []
    for name in names:
        out.extend(config.aliases.get(name, (name,)))
    return out


@functools.lru_cache(maxsize=64)
def parse_template(name: str, text: str) -> Template:
    """The parsed template (cached: the config's texts change only when it is reloaded)."""
    try:
        return Template(name, text, FUNCS)
    except TemplateError as err:
        raise InjectionError(str(err)) from None


def check_templates(config: InjectConfig) -> InjectConfig:
    """The config, once each of its templates parses (istiod refuses a config whose templates do not)."""
    for name, text in config.templates.items():
        parse_template(name, text)
    return config


def render_text(name: str, text: str, ctx: TemplateContext) -> str:
    """The template's output for this pod."""
    template = parse_template(name, text)
    proxy_init = ctx.values["global"]["proxy_init"]
    data = template_data(ctx, proxy_image(ctx), image_reference(ctx, proxy_init["image"]))
    try:
        return template.execute(data)
    except TemplateError as err:
        raise InjectionError(str(err)) from None


def render_user_template(name: str, text: str, ctx: TemplateContext) -> dict[str, Any]:
    rendered = render_text(name, text, ctx)
    try:
        data = yaml.safe_load(rendered)
    except yaml.YAMLError as err:
        raise InjectionError(f"template {name!r} did not render to YAML: {err}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise InjectionError(f"template {name!r} must render to a pod (a mapping)")
    fragment: dict[str, Any] = _drop_nulls(data)
    return fragment


def _drop_nulls(value: Any) -> Any:
    """istiod reads the fragment into a typed Pod, where a field written as null (``emptyDir:``) is
    simply absent."""
    if isinstance(value, dict):
        return {k: _drop_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_nulls(v) for v in value]
    return value


def render_templates(ctx: TemplateContext, config: InjectConfig) -> list[dict[str, Any]]:
    """Each selected template's pod fragment, in order. The pod's traffic annotations are checked first,
    whichever templates run, as istiod's RunTemplate does."""
    validate_annotations(ctx)
    fragments = []
    for name in template_names(ctx, config):
        if name in config.templates:
            fragments.append(render_user_template(name, config.templates[name], ctx))
        elif name in BUILTIN:
            fragments.append(BUILTIN[name](ctx))
        else:
            raise InjectionError(f"requested template {name!r} is not in the injector config")
    return fragments
