"""One --host, spelled for each listener: gRPC wants `[::1]:50051` for an IPv6 address, the
metrics HTTP server a bare `::1` on an AF_INET6 socket. Either spelling of --host (`::` or
`[::]`) gives both listeners the same address."""

from __future__ import annotations

import socket
from typing import Any

from prometheus_client.exposition import ThreadingWSGIServer


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


class HostWSGIServer(ThreadingWSGIServer):
    """The metrics HTTP server on the address family of --host; on `::` IPv4 too (dual stack,
    as gRPC binds `[::]`)."""

    def __init__(self, address: tuple[str, int], handler: Any) -> None:
        self.address_family = address_family(address[0])
        super().__init__(address, handler)

    def server_bind(self) -> None:
        if self.address_family == socket.AF_INET6:
            self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        super().server_bind()
