"""The proxy-side agent (pilot-agent): bootstrap, SDS, xDS relay, Envoy lifecycle."""
