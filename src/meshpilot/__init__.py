"""meshpilot: a drop-in replacement for Istio's discovery server (istiod)."""

__version__ = "0.1.0"
