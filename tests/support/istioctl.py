"""Istio's own istioctl (the reference build) pointed at a meshpilot process outside a cluster:
``--xds-address`` on the plaintext port, or on the client-certificate port with a certificate of the
mesh (``mesh_certs``)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from support.processes import Meshpilot
from support.reference import binary

from meshpilot.ca.authority import CertificateAuthority
from meshpilot.ca.keys import load_plugged

#: A kubeconfig for an API server that is not there: istioctl always builds a Kubernetes client, and
#: with --xds-address it never calls it.
KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters: [{name: none, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: none, user: {}}]
contexts: [{name: none, context: {cluster: none, user: none}}]
current-context: none
"""


class Istioctl:
    def __init__(self, workdir: Path, mp: Meshpilot, certs: Path, cert_port: int) -> None:
        self.binary = binary("istioctl")
        self.mp = mp
        self.certs = certs
        self.cert_port = cert_port
        self.kubeconfig = workdir / "kubeconfig"
        self.kubeconfig.write_text(KUBECONFIG)

    def run(self, *args: str, secure: bool = False, check: bool = True) -> str:
        if secure:
            target = [
                "--xds-address",
                f"127.0.0.1:{self.cert_port}",
                "--cert-dir",
                str(self.certs),
                "--authority",
                "istiod.istio-system.svc",
            ]
        else:
            target = ["--xds-address", f"127.0.0.1:{self.mp.grpc_port}", "--plaintext"]
        # --revision: otherwise istioctl asks the (absent) API server which revision is the default.
        common = ["--kubeconfig", str(self.kubeconfig), "--revision", "default", "--timeout", "10s"]
        done = subprocess.run(
            [str(self.binary), *args, *target, *common],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if check:
            assert done.returncode == 0, f"istioctl {' '.join(args)}: {done.stderr}\n{done.stdout}"
        return done.stdout + done.stderr


def mesh_certs(mp: Meshpilot, directory: Path) -> Path:
    """``--cert-dir`` for istioctl: a certificate of the mesh CA for istio-system/default, the identity
    istioctl names in its node metadata."""
    authority = CertificateAuthority(*load_plugged(mp.ca_dir))
    key = ec.generate_private_key(ec.SECP256R1())
    csr = x509.CertificateSigningRequestBuilder().subject_name(x509.Name([])).sign(key, hashes.SHA256())
    chain = authority.sign(
        csr.public_bytes(serialization.Encoding.PEM), ["spiffe://cluster.local/ns/istio-system/sa/default"]
    )
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "cert-chain.pem").write_text("".join(chain[:-1]))
    (directory / "root-cert.pem").write_text(authority.root_pem)
    (directory / "key.pem").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return directory
