"""The main port's gRPC credentials, from the TLS material config.security read at start-up."""

from __future__ import annotations

import grpc

from warmgate.server.config.security import ServerSecurity


def server_credentials(security: ServerSecurity) -> grpc.ServerCredentials:
    """TLS, or mTLS when a client CA is set (a client without a certificate is refused)."""
    if security.tls_cert is None or security.tls_key is None:
        raise ValueError("TLS needs both a certificate and a key")
    return grpc.ssl_server_credentials(
        [(security.tls_key, security.tls_cert)], root_certificates=security.tls_client_ca,
        require_client_auth=security.tls_client_ca is not None)
