"""How the client reaches a server that uses TLS, mTLS or bearer tokens.

`ClientSecurity()` is plaintext without a token (the server's default). The CLI builds one
from --token-file/--tls-ca/--tls-cert/--tls-key, or the WARMGATE_CLIENT_* environment
variables; the names differ from the server's WARMGATE_TLS_CERT on purpose, so running the
CLI inside the server's container never presents the server's certificate as a client one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import grpc
import grpc.experimental

ENV_TOKEN_FILE = "WARMGATE_CLIENT_TOKEN_FILE"
ENV_TLS_CA = "WARMGATE_CLIENT_TLS_CA"
ENV_TLS_CERT = "WARMGATE_CLIENT_TLS_CERT"
ENV_TLS_KEY = "WARMGATE_CLIENT_TLS_KEY"
ENV_TLS_SERVER_NAME = "WARMGATE_CLIENT_TLS_SERVER_NAME"


@dataclass(frozen=True)
class ClientSecurity:
    token: str | None = field(default=None, repr=False)
    tls: bool = False  # TLS with the system's roots unless root_certificates is given
    root_certificates: bytes | None = None  # PEM CA bundle that signed the server's cert
    certificate_chain: bytes | None = None  # PEM client certificate (mTLS)
    private_key: bytes | None = field(default=None, repr=False)
    # The name to check the server's certificate against, when the target is an IP or an
    # alias the certificate does not list (a pod IP, a port-forward).
    server_name: str | None = None

    def __post_init__(self) -> None:
        if (self.certificate_chain is None) != (self.private_key is None):
            raise ValueError("a client certificate and its key go together")

    @property
    def uses_tls(self) -> bool:
        return self.tls or self.root_certificates is not None or \
            self.certificate_chain is not None

    def metadata(self) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {self.token}"),) if self.token else ()

    def options(self) -> list[tuple[str, str]]:
        return [("grpc.ssl_target_name_override", self.server_name)] if self.server_name \
            else []

    def channel_credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(root_certificates=self.root_certificates,
                                            private_key=self.private_key,
                                            certificate_chain=self.certificate_chain)

    @classmethod
    def from_files(cls, *, token_file: str | None = None, tls_ca: str | None = None,
                   tls_cert: str | None = None, tls_key: str | None = None,
                   tls: bool = False, server_name: str | None = None) -> ClientSecurity:
        """Read the files now, so a wrong path fails before any call (OSError names it)."""
        token = None
        if token_file:
            words = Path(token_file).read_text().split()
            if not words:
                raise ValueError(f"{token_file} holds no token")
            token = words[0]  # the server accepts several (one per line); send the first
        return cls(token=token, tls=tls,
                   root_certificates=Path(tls_ca).read_bytes() if tls_ca else None,
                   certificate_chain=Path(tls_cert).read_bytes() if tls_cert else None,
                   private_key=Path(tls_key).read_bytes() if tls_key else None,
                   server_name=server_name)


# A server stream (Generate, WatchStatus) read on the thread that iterates it. Otherwise grpc's
# synchronous channel starts a new "channel spin" thread whenever a call begins on a channel
# with none in flight (grpc/_channel.py _run_channel_spin_thread), so each Generate of a
# client that sends one at a time paid a thread start, and every message a hop from that
# thread to the reader: 0.1-0.5 ms of each time to first token on a 2-core host
# (bench/serve.py ttft-path).
SINGLE_THREADED_STREAMS = (grpc.experimental.ChannelOptions.SingleThreadedUnaryStream, 1)


def sync_channel(target: str, security: ClientSecurity) -> grpc.Channel:
    options = [*security.options(), SINGLE_THREADED_STREAMS]
    if security.uses_tls:
        return grpc.secure_channel(target, security.channel_credentials(), options)
    return grpc.insecure_channel(target, options)


def aio_channel(target: str, security: ClientSecurity) -> grpc.aio.Channel:
    if security.uses_tls:
        return grpc.aio.secure_channel(target, security.channel_credentials(),
                                       security.options())
    return grpc.aio.insecure_channel(target, security.options())
