"""One --host, spelled for each listener: gRPC wants `[::1]:50051` for an IPv6 address, the
metrics HTTP server a bare `::1` on an AF_INET6 socket. Either spelling of --host (`::` or
`[::]`) gives both listeners the same address."""

from __future__ import annotations

import socket


def bare_host(host: str) -> str:
    """`[::1]` -> `::1`; anything else unchanged."""
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


def is_ipv6(host: str) -> bool:
    return ":" in bare_host(host)


def grpc_address(host: str, port: int) -> str:
    host = bare_host(host)
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def address_family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if is_ipv6(host) else socket.AF_INET
