"""A cluster's keys: who may speak on the data plane and the control plane (``helix keys DIR``).

One folder holds everything a cluster member needs; every file is 0600 in a 0700 folder:

- ``data-server.key`` / ``data-server.pub``: the ZeroMQ CURVE keypair every data-plane PULL socket
  serves with (z85 text); senders must know the public half to connect at all;
- ``data-client.key`` / ``data-client.pub``: the CURVE keypair every PUSH socket connects with; the
  receivers' ZAP handler admits only this public key (:mod:`helix.net.curve`);
- ``grpc.crt`` / ``grpc.key``: a self-signed TLS certificate for every gRPC server (coordinator and
  workers), issued to :data:`TLS_SERVER_NAME`, which every client checks whatever address it dials;
- ``token``: the shared bearer token every worker RPC and worker registration must carry
  (:mod:`helix.net.control`).

The same keys on every member keep distribution to "copy one folder" (``helix worker --keys DIR``)
or "hand one object to Ray" (``helix serve --keys DIR``); anyone holding the folder is a member.
"""

from __future__ import annotations

import os
import secrets
import shutil
import stat
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from helix.core.errors import HelixUserError

#: The name in the certificate; clients verify it instead of the host they dial, so one certificate
#: serves workers at any address.
TLS_SERVER_NAME = "helix-cluster"
CERT_DAYS = 3650

FILES = {"curve_server_secret": "data-server.key", "curve_server_public": "data-server.pub",
         "curve_client_secret": "data-client.key", "curve_client_public": "data-client.pub",
         "tls_key_pem": "grpc.key", "tls_cert_pem": "grpc.crt", "token": "token"}
_PUBLIC = ("curve_server_public", "curve_client_public", "tls_cert_pem")


@dataclass(frozen=True, repr=False)
class ClusterKeys:
    """Every key of one cluster, in memory. Its repr names no secret (Ray and logs may print it)."""

    curve_server_public: bytes
    """z85 (40 characters): the key every data-plane receiver serves with, public half."""
    curve_server_secret: bytes
    curve_client_public: bytes
    """z85: the only sender key the data-plane receivers admit."""
    curve_client_secret: bytes
    tls_cert_pem: bytes
    """Self-signed certificate of every gRPC server; also the clients' only trusted root."""
    tls_key_pem: bytes
    token: str
    """Bearer token of the control plane (``authorization: Bearer TOKEN``)."""

    def __repr__(self) -> str:
        return f"ClusterKeys(data server {self.curve_server_public[:8].decode()}..., secrets hidden)"

    @classmethod
    def load(cls, folder: str | Path) -> "ClusterKeys":
        """Read a ``helix keys`` folder; a missing, malformed or group/world-readable secret file is
        a one-line error."""
        folder = Path(folder)
        if not folder.is_dir():
            raise HelixUserError(f"--keys {str(folder)!r}: no such folder (make one with `helix keys DIR`)")
        values = {}
        for field, name in FILES.items():
            path = folder / name
            if not path.is_file():
                raise HelixUserError(f"--keys {str(folder)!r}: {name} is missing (make the folder "
                                     f"with `helix keys DIR`)")
            if field not in _PUBLIC and path.stat().st_mode & 0o077:
                raise HelixUserError(f"--keys: {path} is readable by others "
                                     f"(mode {stat.S_IMODE(path.stat().st_mode):04o}); chmod 600 it")
            values[field] = path.read_bytes().strip()
        values["token"] = values["token"].decode()
        keys = cls(**values)
        keys.check(str(folder))
        return keys

    def check(self, where: str) -> None:
        for field in ("curve_server_public", "curve_server_secret", "curve_client_public",
                      "curve_client_secret"):
            if len(getattr(self, field)) != 40:
                raise HelixUserError(f"{where}: {FILES[field]} is not a z85 CURVE key (40 characters)")
        if b"BEGIN CERTIFICATE" not in self.tls_cert_pem or b"PRIVATE KEY" not in self.tls_key_pem:
            raise HelixUserError(f"{where}: grpc.crt / grpc.key are not PEM certificate and key")
        if len(self.token) < 16:
            raise HelixUserError(f"{where}: the token is shorter than 16 characters")


def generate(folder: str | Path, force: bool = False) -> list[Path]:
    """Write a new cluster's keys to ``folder`` (made 0700); the files written, in order. An existing
    key file is a one-line error unless ``force``."""
    import zmq
    folder = Path(folder)
    paths = [folder / name for name in FILES.values()]
    existing = [p.name for p in paths if p.exists()]
    if existing and not force:
        raise HelixUserError(f"{folder} already holds {', '.join(existing)}: keep them, or pass "
                             f"--force to replace them (every worker then needs the new folder)")
    folder.mkdir(parents=True, exist_ok=True)
    os.chmod(folder, 0o700)
    server_public, server_secret = zmq.curve_keypair()
    client_public, client_secret = zmq.curve_keypair()
    cert, key = self_signed_cert(TLS_SERVER_NAME, CERT_DAYS)
    values = {"curve_server_secret": server_secret, "curve_server_public": server_public,
              "curve_client_secret": client_secret, "curve_client_public": client_public,
              "tls_key_pem": key, "tls_cert_pem": cert, "token": secrets.token_urlsafe(32).encode()}
    for field, name in FILES.items():
        _write_private(folder / name, values[field] + (b"" if values[field].endswith(b"\n") else b"\n"))
    return paths


def _write_private(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` with mode 0600 from the start (never readable by others)."""
    if path.exists():
        path.unlink()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def self_signed_cert(name: str, days: int) -> tuple[bytes, bytes]:
    """(certificate, private key) in PEM: EC P-256, subject and SAN ``name``. With the
    ``cryptography`` package when installed, else the ``openssl`` command."""
    try:
        import cryptography  # noqa: F401
    except ImportError:
        return _openssl_cert(name, days)
    return _cryptography_cert(name, days)


def _cryptography_cert(name: str, days: int) -> tuple[bytes, bytes]:
    import datetime
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    return (cert.public_bytes(serialization.Encoding.PEM),
            key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                              serialization.NoEncryption()))


def _openssl_cert(name: str, days: int) -> tuple[bytes, bytes]:
    if shutil.which("openssl") is None:
        raise HelixUserError("making the TLS certificate needs the `cryptography` package or the "
                             "`openssl` command; install either")
    with tempfile.TemporaryDirectory() as tmp:
        crt, key = Path(tmp) / "c.pem", Path(tmp) / "k.pem"
        subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                        "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", str(key), "-out", str(crt),
                        "-days", str(days), "-subj", f"/CN={name}", "-addext", f"subjectAltName=DNS:{name}"],
                       check=True, capture_output=True)
        return crt.read_bytes(), key.read_bytes()
