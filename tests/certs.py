"""Throwaway PKI for the TLS tests: a CA, a server cert for 127.0.0.1/localhost, a client cert.

Made with the `cryptography` package when it is installed, else with the `openssl` CLI;
`make_pki` skips the calling test when neither is there. EC P-256 keys: fast to generate.
"""

from __future__ import annotations

import datetime
import ipaddress
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

SERVER_NAMES = ("localhost",)
SERVER_IPS = ("127.0.0.1",)


@dataclass(frozen=True)
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    # A second CA and a client cert it signed: valid, but not trusted by the server.
    other_client_cert: Path
    other_client_key: Path


def make_pki(directory: Path) -> Pki:
    try:
        import cryptography  # noqa: F401
    except ImportError:
        if shutil.which("openssl") is None:
            pytest.skip("neither the cryptography package nor the openssl CLI is available")
        return _with_openssl(directory)
    return _with_cryptography(directory)


# -- cryptography -----------------------------------------------------------------------

def _with_cryptography(d: Path) -> Pki:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.timezone.utc)

    def name(cn: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    def write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> Path:
        path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
        return path

    def issue(cn: str, key: ec.EllipticCurvePrivateKey, issuer: x509.Name,
              issuer_key: ec.EllipticCurvePrivateKey, *, ca: bool,
              usage: x509.ObjectIdentifier | None, san: bool, path: Path) -> Path:
        builder = (x509.CertificateBuilder().subject_name(name(cn)).issuer_name(issuer)
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(minutes=5))
                   .not_valid_after(now + datetime.timedelta(days=1))
                   .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
        if usage is not None:
            builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        if san:
            builder = builder.add_extension(x509.SubjectAlternativeName(
                [x509.DNSName(n) for n in SERVER_NAMES]
                + [x509.IPAddress(ipaddress.ip_address(ip)) for ip in SERVER_IPS]),
                critical=False)
        cert = builder.sign(issuer_key, hashes.SHA256())
        path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        return path

    def authority(cn: str, path: Path) -> tuple[x509.Name, ec.EllipticCurvePrivateKey]:
        key = ec.generate_private_key(ec.SECP256R1())
        issue(cn, key, name(cn), key, ca=True, usage=None, san=False, path=path)
        return name(cn), key

    ca_name, ca_key = authority("warmgate test CA", d / "ca.pem")
    other_name, other_key = authority("untrusted CA", d / "other-ca.pem")
    leaves = {}
    for label, issuer, issuer_key, usage, san in (
            ("server", ca_name, ca_key, ExtendedKeyUsageOID.SERVER_AUTH, True),
            ("client", ca_name, ca_key, ExtendedKeyUsageOID.CLIENT_AUTH, False),
            ("other-client", other_name, other_key, ExtendedKeyUsageOID.CLIENT_AUTH, False)):
        key = ec.generate_private_key(ec.SECP256R1())
        leaves[label] = (issue(label, key, issuer, issuer_key, ca=False, usage=usage, san=san,
                               path=d / f"{label}.pem"),
                         write_key(key, d / f"{label}-key.pem"))
    return Pki(d / "ca.pem", *leaves["server"], *leaves["client"], *leaves["other-client"])


# -- openssl CLI ------------------------------------------------------------------------

def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=30)


def _with_openssl(d: Path) -> Pki:
    def authority(stem: str, cn: str) -> None:
        _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
                 "-nodes", "-keyout", f"{stem}-key.pem", "-out", f"{stem}.pem", "-days", "1",
                 "-subj", f"/CN={cn}", cwd=d)

    def leaf(stem: str, ca: str, ext: str) -> None:
        _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                 "-keyout", f"{stem}-key.pem", "-out", f"{stem}.csr", "-subj", f"/CN={stem}",
                 cwd=d)
        (d / f"{stem}.ext").write_text(ext)
        _openssl("x509", "-req", "-in", f"{stem}.csr", "-CA", f"{ca}.pem", "-CAkey",
                 f"{ca}-key.pem", "-CAcreateserial", "-out", f"{stem}.pem", "-days", "1",
                 "-extfile", f"{stem}.ext", cwd=d)

    authority("ca", "warmgate test CA")
    authority("other-ca", "untrusted CA")
    san = ",".join([f"DNS:{n}" for n in SERVER_NAMES] + [f"IP:{ip}" for ip in SERVER_IPS])
    leaf("server", "ca", f"extendedKeyUsage=serverAuth\nsubjectAltName={san}\n")
    leaf("client", "ca", "extendedKeyUsage=clientAuth\n")
    leaf("other-client", "other-ca", "extendedKeyUsage=clientAuth\n")
    return Pki(d / "ca.pem", d / "server.pem", d / "server-key.pem", d / "client.pem",
               d / "client-key.pem", d / "other-client.pem", d / "other-client-key.pem")
