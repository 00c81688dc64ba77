"""Go's text/template, in Python: the engine istiod renders injection templates with.

``Template(name, text, *funcmaps).execute(data)``; functions are passed in (``sprig.FUNCS`` for the
sprig library subset), never global. Data are plain Python values plus ``GoStruct`` views; see
``values`` for how Go's nil, missing keys and maps map onto them."""

from meshpilot.webhooks.inject.gotemplate.errors import TemplateError
from meshpilot.webhooks.inject.gotemplate.execute import FuncMap, Template
from meshpilot.webhooks.inject.gotemplate.values import MISSING, GoStruct, StrMap

__all__ = ["MISSING", "FuncMap", "GoStruct", "StrMap", "Template", "TemplateError"]
