"""CSRs signed per CPU-second by ``CertificateAuthority.sign`` in this process (a best case: no gRPC,
no TLS)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from bench.ca_keys import authority_in, make_csrs, spiffe_id


def signing_rate(ca_key: str, csr_key: str, count: int, workdir: Path) -> dict[str, Any]:
    """``count`` distinct CSRs (made first) signed by ``CertificateAuthority.sign``; CPU and wall time."""
    authority = authority_in(workdir / f"ca-{ca_key}", ca_key)
    identity = spiffe_id("default", "bench")
    csrs = [csr for _, csr in make_csrs(csr_key, [identity] * count)]
    authority.sign(csrs[0], [identity])  # the first call pays for imports and caches
    cpu, wall = time.process_time(), time.perf_counter()
    for csr in csrs:
        authority.sign(csr, [identity])
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    return {
        "ca_key": ca_key,
        "csr_key": csr_key,
        "count": count,
        "cpu_seconds": round(cpu, 4),
        "wall_seconds": round(wall, 4),
        "per_cpu_second": round(count / cpu, 1) if cpu > 0 else None,
        "cpu_ms_per_certificate": round(cpu / count * 1000, 3),
    }


def run_signing(count: int, workdir: Path) -> list[dict[str, Any]]:
    return [
        signing_rate(ca_key, csr_key, count, workdir)
        for ca_key in ("rsa", "ecdsa")
        for csr_key in ("rsa", "ecdsa")
    ]
