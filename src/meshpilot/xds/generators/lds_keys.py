"""The parts of a sidecar's listener keys that are its own, kept on its stream from push to push.

A full push that reaches LDS asks, for every proxy, which Telemetry objects, loggers and tracing
apply to it, and which authorization and authentication policies and PeerAuthentication: the
parts of its listeners' keys that are its own (the listeners themselves are shared, ``lds``). A
VirtualService or DestinationRule change, the commonest full push, changes none of these answers,
yet asking them again took about 0.19 of the 0.64 ms a route push spent per proxy
(``bench/notes.md``). So they are kept on the stream's LDS subscription with what they were worked
out from, and worked out again only when that changed:
- the kinds they read, the services (the collectors of telemetry providers and ext_authz servers
  resolve against them), the MeshConfig and the domain suffix: ``PushContext.kept_token``, compared
  by identity;
- the proxy's labels (its namespace, type and metadata are its identity, fixed for the stream; the
  proxy is compared too).
A proxy that some RequestAuthentication selects never keeps them: its key names fetched JWKS, which
change without a config change. With ``UNSAFE_PILOT_ENABLE_RUNTIME_ASSERTIONS`` (the XdsCache's
``verify``) a kept answer is worked out again and compared, and the fresh one is used.

What is reported while working them out (a provider MeshConfig does not define, one that cannot be
configured) is reported when they are worked out, not again while they are kept.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass

from meshpilot.model import telemetry
from meshpilot.model.kind import Kind
from meshpilot.model.peer_authentication import WorkloadMtls
from meshpilot.model.proxy import Proxy
from meshpilot.model.push_context import PushContext, same_token
from meshpilot.networking import access_log, inbound_security, tracing
from meshpilot.networking.listener_inbound import workload_mtls
from meshpilot.networking.telemetry_problems import report_undefined
from meshpilot.networking.tracing import HcmTracing
from meshpilot.xds.cache import XdsCache
from meshpilot.xds.connection import WatchedResource
from meshpilot.xds.types import TypeUrl

#: The kinds the answers read of the snapshot's configs.
_READS = (
    Kind.TELEMETRY,
    Kind.AUTHORIZATION_POLICY,
    Kind.REQUEST_AUTHENTICATION,
    Kind.PEER_AUTHENTICATION,
)


def telemetry_key(proxy: Proxy, push: PushContext) -> tuple[object, object]:
    """What of telemetry decides the proxy's listeners but tracing: the Telemetry objects in its
    scope (with their specs, as inbound keys outlive the snapshot) and its loggers (with their
    collectors' clusters). The providers the scope names but MeshConfig lacks are reported here."""
    report_undefined(push, proxy)
    return (telemetry.fingerprint(push, proxy), access_log.key(push, proxy))


@dataclass(frozen=True, slots=True)
class ListenerKeys:
    """A sidecar's own parts of its listeners' keys."""

    #: The Telemetry objects in its scope and its loggers (``telemetry_key``).
    telemetry: tuple[object, object]
    client_tracing: HcmTracing
    server_tracing: HcmTracing
    #: The AuthorizationPolicies and RequestAuthentications selecting it, and fetched JWKS.
    security: Hashable
    #: Its workload's PeerAuthentication: each port's chains.
    mtls: WorkloadMtls

    @property
    def compared(self) -> tuple[object, ...]:
        """What decides the keys (tracing by its serialized form)."""
        return (
            self.telemetry,
            self.client_tracing.fingerprint,
            self.server_tracing.fingerprint,
            self.security,
            self.mtls,
        )


@dataclass(frozen=True, slots=True)
class _Kept:
    #: Whose they are: a subscription belongs to one stream, but a caller may hand one to several.
    proxy: Proxy
    token: tuple[object, ...]
    labels: Mapping[str, str]
    keys: ListenerKeys


def listener_keys(
    proxy: Proxy, push: PushContext, watch: WatchedResource, cache: XdsCache | None
) -> ListenerKeys:
    """The proxy's own parts of its listeners' keys: kept ones while what they read is unchanged."""
    token = push.kept_token(_READS)
    # Read before the keys are worked out: the labels kept are those they were worked out with.
    labels = proxy.labels
    kept = watch.kept
    if (
        isinstance(kept, _Kept)
        and kept.proxy is proxy
        and push.share_outputs
        and same_token(kept.token, token)
        and kept.labels == labels
    ):
        if cache is None or not cache.verify:
            return kept.keys
        keys, keepable = _work_out(proxy, push)
        if keys.compared == kept.keys.compared:
            return keys
        cache.mismatch(TypeUrl.LISTENER, f"listener key of {proxy.id}")
    else:
        keys, keepable = _work_out(proxy, push)
    watch.kept = _Kept(proxy, token, labels, keys) if keepable and push.share_outputs else None
    return keys


def _work_out(proxy: Proxy, push: PushContext) -> tuple[ListenerKeys, bool]:
    """The keys, and whether they may be kept (no fetched JWKS in them)."""
    client_tracing, server_tracing = tracing.sides(push, proxy)
    security = inbound_security.inputs(proxy, push)
    keys = ListenerKeys(
        telemetry=telemetry_key(proxy, push),
        client_tracing=client_tracing,
        server_tracing=server_tracing,
        security=security.key,
        mtls=workload_mtls(proxy, push),
    )
    return keys, not security.request_authentications
