"""Outbound EDS clusters encoded from a shared template instead of built as protobuf objects.

Building a Cluster as protobuf objects costs tens of microseconds; nearly all
of it (connect timeout, load balancer, circuit breakers, protocol options,
filters) is the same for every cluster of a class: the same traffic policy
(none, or the one a rule resolves to for the subset and port, whichever rule
it is), protocol and proxy capabilities (``cluster.template_inputs`` names
what a class shares). The first cluster of a class is built by the reference builder,
its per-cluster fields are cleared and the rest is serialized once as the
class template; every cluster of the class is then the template plus its
own name, metadata and TLS, written by ``wire.outbound_cluster``. Tests check
that the result parses into exactly what ``build_outbound_cluster`` makes.
"""

from __future__ import annotations

from meshpilot.model.service import Resolution, Service
from meshpilot.networking import endpoint as eds
from meshpilot.networking import extensions, names, wire
from meshpilot.networking import traffic_policy as tp
from meshpilot.networking.auto_mtls import auto_mtls_applies, service_mtls_mode
from meshpilot.networking.cluster import (
    ClusterInputs,
    OutboundSpec,
    build_outbound_cluster,
    config_path,
    template_inputs,
)
from meshpilot.networking.protobuf import serialize
from meshpilot.networking.tls import istio_mutual_upstream

_NO_TLS = (b"", b"")
#: The fields wire.outbound_cluster writes per cluster; the template must not hold them.
_PER_CLUSTER_FIELDS = ("name", "alt_stat_name", "metadata", "transport_socket", "transport_socket_matches")


class OutboundClusterEncoder:
    """Encodes the outbound clusters of one proxy's scope in one snapshot.

    Templates and TLS contexts are kept on the push context, keyed by what
    they are built from, so every proxy of the snapshot shares them.
    """

    def __init__(self, inputs: ClusterInputs) -> None:
        self.inputs = inputs
        self._push = inputs.push
        self._metadata_exchange = extensions.has_upstream_metadata_exchange(inputs.proxy)
        # Local views of the shared memo: the per-cluster path does one small dict lookup.
        self._templates: dict[tuple[object, str, str], bytes | None] = {}
        self._tls: dict[bool, tuple[bytes, bytes]] = {}

    def encode(self, spec: OutboundSpec) -> bytes | None:
        """The cluster as a serialized ``Any``, or None when the reference builder must make it."""
        svc, port, subset, rule = spec.service, spec.port, spec.subset, spec.rule
        if svc.resolution is not Resolution.CLIENT_SIDE_LB:
            return None  # DNS and passthrough clusters carry per-service data: reference builder
        # The local key names the class cheaply (a rule's policy differs per port and subset); its
        # first cluster resolves what the template is built from, which rules with equal policies share.
        key = (
            (rule.fingerprint, subset, port.port) if rule is not None else None,
            port.protocol.value,
            svc.traffic_distribution,
        )
        template = self._templates.get(key, b"")
        if template == b"":
            inputs = template_inputs(svc, port, tp.cluster_policy(rule, subset, port.port))
            shared = ("cds-template", inputs, self._metadata_exchange)
            template = self._templates[key] = self._push.memoized(shared, lambda: self._template(spec))
        if template is None:
            return None
        name = names.outbound_cluster(port.port, subset, svc.hostname)
        sni = names.sni_cluster(port.port, subset, svc.hostname)
        tls, common = wire.CLUSTER_TLS_NONE, _NO_TLS
        sans: tuple[str, ...] = ()
        config = ""
        if rule is not None:
            config = config_path("destination-rule", rule.first.namespace, rule.first.name)
            policy = tp.cluster_policy(rule, subset, port.port)
            if policy.proxy_protocol is not None:
                return None  # its transport sockets are wrapped per cluster: the reference builder does it
            policy_tls = policy.tls
            if policy_tls is not None:
                if policy_tls.mode in (eds.TLS_SIMPLE, eds.TLS_MUTUAL):
                    return None  # TLS origination contexts are per rule: the reference builder makes them
                if policy_tls.mode == eds.TLS_ISTIO_MUTUAL:
                    tls = wire.CLUSTER_TLS_ALWAYS
                    sans = tuple(policy_tls.subject_alt_names) or self._push.service_accounts(svc)
                    common = self._common_tls(port.protocol.is_http2)
                    sni = policy_tls.sni or sni
                return self._finish(template, name, config, subset, svc, tls, common, sans, sni)
        mode = service_mtls_mode(self._push, self.inputs.index, svc, port, rule, subset)
        if auto_mtls_applies(mode, self._push):
            tls = wire.CLUSTER_TLS_AUTO
            sans = self._push.service_accounts(svc)
            common = self._common_tls(port.protocol.is_http2)
        return self._finish(template, name, config, subset, svc, tls, common, sans, sni)

    @staticmethod
    def _finish(
        template: bytes,
        name: str,
        config: str,
        subset: str,
        svc: Service,
        tls: int,
        common: tuple[bytes, bytes],
        sans: tuple[str, ...],
        sni: str,
    ) -> bytes:
        metadata = wire.cluster_metadata(
            config, subset, svc.hostname, svc.name, svc.namespace, svc.mesh_external
        )
        return wire.outbound_cluster(template, name, metadata, tls, common[0], common[1], sans, sni)

    def _template(self, spec: OutboundSpec) -> bytes | None:
        cluster = build_outbound_cluster(self.inputs, spec.service, spec.port, spec.subset, spec.rule)
        if cluster is None or cluster.type != cluster.EDS:
            return None  # e.g. a PASSTHROUGH load balancer: the reference builder decides alone
        for field in _PER_CLUSTER_FIELDS:
            cluster.ClearField(field)
        cluster.eds_cluster_config.ClearField("service_name")
        return serialize(cluster)

    def _common_tls(self, http2: bool) -> tuple[bytes, bytes]:
        """In-mesh mTLS CommonTlsContext without SAN matchers: its fields before the
        combined validation context, and the rest of that context (wire writes the SANs)."""
        found = self._tls.get(http2)
        if found is None:
            alpn = extensions.mtls_client_alpn(self.inputs.proxy, http2=http2)
            found = self._push.memoized(("cds-tls", tuple(alpn)), lambda: _split_common_tls(alpn))
            self._tls[http2] = found
        return found


def _split_common_tls(alpn: list[str]) -> tuple[bytes, bytes]:
    common = istio_mutual_upstream("", (), alpn).common_tls_context
    validation = common.combined_validation_context
    validation.ClearField("default_validation_context")
    rest = serialize(validation)
    common.ClearField("combined_validation_context")
    return serialize(common), rest
