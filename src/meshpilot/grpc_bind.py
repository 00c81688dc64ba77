"""Binding a gRPC server's port, with one error whatever grpcio does when the port is taken (some
versions return 0 from ``add_*_port``, others raise a RuntimeError that names no purpose)."""

from __future__ import annotations

import grpc


def bind(
    server: grpc.aio.Server,
    target: str,
    purpose: str,
    credentials: grpc.ServerCredentials | None = None,
    *,
    where: str | None = None,
) -> int:
    """Listen on ``target`` (TLS with ``credentials``); the port bound. OSError "cannot listen on
    <where> for <purpose>" when it cannot."""
    try:
        port = (
            server.add_insecure_port(target)
            if credentials is None
            else server.add_secure_port(target, credentials)
        )
    except RuntimeError:
        port = 0
    if port == 0:
        raise OSError(f"cannot listen on {where or target} for {purpose}")
    return int(port)
