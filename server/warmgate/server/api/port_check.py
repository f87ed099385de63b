"""Find a busy --port, --health-port or --metrics-port before the server starts.

gRPC reports a port it cannot bind only as "0" (and some C-core log lines), long after the
model config was logged; a second server must not look as if it started while a stranger
answers on its port. So each configured port is bound once here, with the options the real
servers use (SO_REUSEADDR, as gRPC and http.server set it, never SO_REUSEPORT), and released.
A port taken between this check and the real bind still fails the start, in main.
"""

from __future__ import annotations

import errno
import socket
from collections.abc import Iterable


class PortInUse(Exception):
    def __init__(self, flag: str, address: str, reason: str) -> None:
        super().__init__(f"argument {flag}: cannot bind {address}: {reason}")
        self.flag = flag
        self.address = address


def _address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def check_port(flag: str, host: str, port: int) -> None:
    """Bind every address `host` resolves to on `port`; PortInUse names the flag."""
    try:
        infos = socket.getaddrinfo(host.strip("[]") or None, port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise PortInUse(flag, _address(host, port), f"cannot resolve {host!r}: {exc.strerror}"
                        ) from None
    for family, kind, proto, _, sockaddr in infos:
        with socket.socket(family, kind, proto) as sock:
            # IPV6_V6ONLY stays at Linux's default (off), as gRPC leaves it: "::" then
            # conflicts with an IPv4 listener on the port, as gRPC's own bind would.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind(sockaddr)
            except OSError as exc:
                reason = exc.strerror or str(exc)
                if exc.errno == errno.EADDRINUSE:
                    reason += " (another process holds it)"
                raise PortInUse(flag, _address(str(sockaddr[0]), port), reason) from None


def check_ports(host: str, ports: Iterable[tuple[str, int]]) -> None:
    """Each (flag, port) with a fixed port (0 picks a free one, -1 is off) is free, and no
    two flags ask for the same one."""
    seen: dict[int, str] = {}
    for flag, port in ports:
        if port <= 0:
            continue
        if port in seen:
            raise PortInUse(flag, _address(host, port), f"{seen[port]} asks for the same port")
        seen[port] = flag
        check_port(flag, host, port)
