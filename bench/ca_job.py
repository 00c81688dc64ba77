"""The CA benchmark's job: sizes and keys of the signing rate and the certificate storm."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CaJob:
    #: CSRs signed per (CA key, CSR key) pair for the signing rate.
    sign_count: int = 200
    #: Workloads in the certificate storm.
    workloads: int = 2000
    #: The CA's key in the storm (istiod's default: RSA 2048) and the key of each fresh CSR
    #: (istio-agent's default: RSA 2048).
    ca_key: str = "rsa"
    csr_key: str = "rsa"
    #: Client processes; each holds its share of the workloads' channels in one asyncio loop.
    client_processes: int = 2
    ready_interval: float = 0.05
    timeout: float = 600.0
