"""The agent's SDS serves the files a DestinationRule names, as pilot-agent does."""

from __future__ import annotations

from pathlib import Path

from meshpilot.agent.sds import WorkloadCredentials, file_secret


def test_file_cert_and_file_root(tmp_path: Path) -> None:
    chain, key, root = tmp_path / "chain.pem", tmp_path / "key.pem", tmp_path / "root.pem"
    chain.write_bytes(b"CHAIN")
    key.write_bytes(b"KEY")
    root.write_bytes(b"ROOT")
    cert = file_secret(f"file-cert:{chain}~{key}")
    assert cert is not None and cert.name == f"file-cert:{chain}~{key}"
    assert cert.tls_certificate.certificate_chain.inline_bytes == b"CHAIN"
    assert cert.tls_certificate.private_key.inline_bytes == b"KEY"
    roots = file_secret(f"file-root:{root}")
    assert roots is not None and roots.validation_context.trusted_ca.inline_bytes == b"ROOT"
    # The workload's own secrets still come first; other names fall through to files.
    creds = WorkloadCredentials(b"c", b"k", b"r")
    served = creds.secret(f"file-root:{root}")
    assert served is not None and served.validation_context.trusted_ca.inline_bytes == b"ROOT"


def test_unreadable_or_malformed_names_are_not_served(tmp_path: Path) -> None:
    assert file_secret(f"file-root:{tmp_path / 'missing.pem'}") is None
    assert file_secret(f"file-cert:{tmp_path / 'only-a-chain.pem'}") is None, "no ~key part"
    assert file_secret("kubernetes://secret") is None
