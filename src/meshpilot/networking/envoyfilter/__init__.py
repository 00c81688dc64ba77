"""EnvoyFilter: istiod's patches applied to the Envoy config meshpilot generates.

``patches`` reads a filter's patches once per version and gathers those a proxy takes;
``clusters``, ``listeners`` and ``routes`` apply them to parsed Envoy messages in istiod's order;
``merge`` is istiod's MERGE; ``values`` reads patch values. The generators' hooks that parse and
re-encode resources live in ``xds/generators/envoy_filters.py``.
"""
