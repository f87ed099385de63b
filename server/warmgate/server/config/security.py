"""The main port's TLS material and accepted bearer tokens, read once at start-up.

Read by load_server_config, so a missing or unreadable file fails at start naming its flag,
not at the first handshake. The key and the tokens are kept out of repr(): a config that
ends up in a log must not carry them. Plain bytes and the standard library's ssl checks only:
the gRPC credentials are made from them by warmgate.server.api.security.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field

from warmgate.server.config.flags import flag

# More than any token list, certificate chain or CA bundle (a system's whole bundle of
# public roots is about 200 KiB).
MAX_FILE_BYTES = 4 << 20


class SecurityConfigError(ValueError):
    def __init__(self, flag: str, message: str) -> None:
        super().__init__(f"{flag}: {message}")
        self.flag = flag
        self.message = message


@dataclass(frozen=True)
class ServerSecurity:
    # Any of these tokens is accepted (several let a rotation overlap old and new).
    auth_tokens: tuple[bytes, ...] = field(default=(), repr=False, metadata=flag(
        "--auth-token-file", "file of bearer tokens (one per line); WarmupKernels, MixedWarmup "
        "and any other mutating RPC then need 'authorization: Bearer <token>'", parse=str,
        default=None, direct=False))
    tls_cert: bytes | None = field(default=None, metadata=flag(  # PEM chain
        "--tls-cert", "PEM certificate chain: serve the main port over TLS", parse=str,
        direct=False))
    tls_key: bytes | None = field(default=None, repr=False, metadata=flag(  # PEM private key
        "--tls-key", "PEM private key of --tls-cert", parse=str, direct=False))
    # Set means mTLS: a client without a certificate signed by it is refused.
    tls_client_ca: bytes | None = field(default=None, metadata=flag(
        "--tls-client-ca", "PEM CA bundle: require client certificates signed by it (mTLS)",
        parse=str, direct=False))

    @property
    def tls(self) -> bool:
        return self.tls_cert is not None

    @property
    def auth(self) -> bool:
        return bool(self.auth_tokens)


def _read(flag: str, path: str) -> bytes:
    """The file's bytes, read to at most MAX_FILE_BYTES: `--auth-token-file /dev/zero` was
    read without end until the process ran out of memory."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise SecurityConfigError(flag, f"cannot read {path}: {exc.strerror}") from None
    if len(data) > MAX_FILE_BYTES:
        raise SecurityConfigError(flag, f"{path} holds more than {MAX_FILE_BYTES >> 20} MiB; a "
                                        "token list, certificate chain or CA bundle is far "
                                        "smaller (is it the right file?)")
    if not data.strip():
        raise SecurityConfigError(flag, f"{path} is empty")
    return data


def _pem(flag: str, path: str) -> bytes:
    data = _read(flag, path)
    if b"-----BEGIN " not in data:
        raise SecurityConfigError(flag, f"{path} is not PEM")
    return data


def _no_passphrase() -> bytes:
    # Without a callback OpenSSL would prompt on the terminal for an encrypted key's
    # passphrase, hanging a server; an empty one fails, and the error says why.
    return b""


def _check_tls_pair(cert_path: str, cert: bytes, key_path: str, key: bytes) -> None:
    """Parse the chain and the key with OpenSSL and check they belong together, so a bad
    pair fails at start naming its flag rather than at the first handshake (or at bind).

    Names the flag most likely at fault: a key in --tls-cert or a certificate in
    --tls-key is a swapped pair; a certificate OpenSSL cannot parse is --tls-cert's; a key
    it cannot parse, or one of another certificate, is --tls-key's.
    """
    if b"PRIVATE KEY-----" in cert and b"CERTIFICATE-----" not in cert:
        raise SecurityConfigError("--tls-cert", f"{cert_path} holds a private key, not a "
                                                "certificate (--tls-cert and --tls-key swapped?)")
    if b"PRIVATE KEY-----" not in key:
        hint = (" (--tls-cert and --tls-key swapped?)" if b"CERTIFICATE-----" in key else "")
        raise SecurityConfigError("--tls-key", f"{key_path} holds no PEM private key{hint}")
    if b"ENCRYPTED" in key:
        raise SecurityConfigError("--tls-key", f"{key_path} is encrypted; gRPC needs an "
                                               "unencrypted PEM key")
    try:
        ssl.create_default_context().load_verify_locations(cadata=cert.decode("ascii"))
    except (ssl.SSLError, UnicodeDecodeError, ValueError) as exc:
        raise SecurityConfigError("--tls-cert", f"{cert_path} is not a valid PEM certificate "
                                                f"chain: {exc}") from None
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(
            cert_path, key_path, password=_no_passphrase)
    except ssl.SSLError as exc:
        if exc.reason == "KEY_VALUES_MISMATCH":
            raise SecurityConfigError("--tls-key", f"{key_path} is not the private key of the "
                                                   f"certificate in {cert_path}") from None
        raise SecurityConfigError("--tls-key", f"{key_path} is not a valid PEM private key "
                                               f"for {cert_path}: {exc}") from None
    except OSError as exc:
        raise SecurityConfigError("--tls-key", f"cannot read {key_path}: {exc}") from None


def _check_ca(path: str, data: bytes) -> None:
    try:
        ssl.create_default_context().load_verify_locations(cadata=data.decode("ascii"))
    except (ssl.SSLError, UnicodeDecodeError, ValueError) as exc:
        raise SecurityConfigError("--tls-client-ca", f"{path} is not a valid PEM CA bundle: "
                                                     f"{exc}") from None


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
    cert = _pem("--tls-cert", tls_cert) if tls_cert else None
    key = _pem("--tls-key", tls_key) if tls_key else None
    if tls_cert and tls_key and cert is not None and key is not None:
        _check_tls_pair(tls_cert, cert, tls_key, key)
    client_ca = _pem("--tls-client-ca", tls_client_ca) if tls_client_ca else None
    if tls_client_ca and client_ca is not None:
        _check_ca(tls_client_ca, client_ca)
    return ServerSecurity(
        auth_tokens=read_tokens("--auth-token-file", auth_token_file) if auth_token_file
        else (),
        tls_cert=cert, tls_key=key, tls_client_ca=client_ca)
