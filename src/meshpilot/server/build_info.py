"""What the running server says about its build: the control plane ``istioctl version`` reports.

istiod names itself in sync status responses (``ControlPlane.identifier``) with the JSON of its
``IstioControlPlaneInstance``: component ``istiod``, its pod name, and its build. meshpilot reports
its own version there (and in ``istio_build``'s ``tag``), not an Istio release.
"""

from __future__ import annotations

import platform

import orjson

from meshpilot import __version__


def build_info() -> dict[str, str]:
    """istiod's BuildInfo fields; what a Python build does not know is "unknown", as in an untagged
    Go build, and the runtime is Python's."""
    return {
        "version": __version__,
        "revision": "unknown",
        "golang_version": f"python{platform.python_version()}",
        "status": "unknown",
        "tag": __version__,
    }


def control_plane_identifier(pod_name: str) -> str:
    """The identifier of sync status responses (POD_NAME is istiod's instance ID too)."""
    return orjson.dumps({"Component": "istiod", "ID": pod_name, "Info": build_info()}).decode()
