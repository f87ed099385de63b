"""The main port's TLS material and accepted bearer tokens, read once at start-up.

Read by load_server_config, so a missing or unreadable file fails at start naming its flag,
not at the first handshake. The key and the tokens are kept out of repr(): a config that
ends up in a log must not carry them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import grpc


class SecurityConfigError(ValueError):
    def __init__(self, flag: str, message: str) -> None:
        super().__init__(f"{flag}: {message}")
        self.flag = flag
        self.message = message


@dataclass(frozen=True)
class ServerSecurity:
    # Any of these tokens is accepted (several let a rotation overlap old and new).
    auth_tokens: tuple[bytes, ...] = field(default=(), repr=False)
    tls_cert: bytes | None = None  # PEM chain
    tls_key: bytes | None = field(default=None, repr=False)  # PEM private key
    # PEM CA bundle for client certificates; set means mTLS (a client without one is refused).
    tls_client_ca: bytes | None = None

    @property
    def tls(self) -> bool:
        return self.tls_cert is not None

    @property
    def auth(self) -> bool:
        return bool(self.auth_tokens)

    def server_credentials(self) -> grpc.ServerCredentials:
        if self.tls_cert is None or self.tls_key is None:
            raise ValueError("TLS needs both a certificate and a key")
        return grpc.ssl_server_credentials(
            [(self.tls_key, self.tls_cert)], root_certificates=self.tls_client_ca,
            require_client_auth=self.tls_client_ca is not None)


def _read(flag: str, path: str) -> bytes:
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise SecurityConfigError(flag, f"cannot read {path}: {exc.strerror}") from None
    if not data.strip():
        raise SecurityConfigError(flag, f"{path} is empty")
    return data


def _pem(flag: str, path: str) -> bytes:
    data = _read(flag, path)
    if b"-----BEGIN " not in data:
        raise SecurityConfigError(flag, f"{path} is not PEM")
    return data


def read_tokens(flag: str, path: str) -> tuple[bytes, ...]:
    """One token per non-empty line; each must be a valid gRPC metadata value."""
    tokens = []
    for number, line in enumerate(_read(flag, path).splitlines(), 1):
        token = line.strip()
        if not token:
            continue
        # Printable ASCII without spaces: what a header value can carry unchanged.
        if not all(0x21 <= b <= 0x7E for b in token):
            raise SecurityConfigError(flag, f"{path} line {number}: a token must be printable "
                                            "ASCII without spaces")
        tokens.append(token)
    if not tokens:
        raise SecurityConfigError(flag, f"{path} holds no token")
    return tuple(tokens)


def load_server_security(*, auth_token_file: str | None, tls_cert: str | None,
                         tls_key: str | None, tls_client_ca: str | None) -> ServerSecurity:
    if (tls_cert is None) != (tls_key is None):
        missing = "--tls-key" if tls_key is None else "--tls-cert"
        raise SecurityConfigError(missing, "--tls-cert and --tls-key go together")
    if tls_client_ca is not None and tls_cert is None:
        raise SecurityConfigError("--tls-client-ca", "mTLS needs --tls-cert and --tls-key")
    return ServerSecurity(
        auth_tokens=read_tokens("--auth-token-file", auth_token_file) if auth_token_file
        else (),
        tls_cert=_pem("--tls-cert", tls_cert) if tls_cert else None,
        tls_key=_pem("--tls-key", tls_key) if tls_key else None,
        tls_client_ca=_pem("--tls-client-ca", tls_client_ca) if tls_client_ca else None)
