"""A private CA and a server certificate for one run (``astraflow certs create``, the launcher).

Why our own CA: a run's services are reached by IP address or a cluster-internal name that no
public CA will certify, and a self-signed server certificate would have to be trusted one by one.
One CA per run signs one server certificate whose subject alternative names list every host and
IP the services are reached by; clients trust only that CA (``--ca-file``), so nothing else's
certificate passes for the run's services. The CA key stays next to the CA (mode 0600) so more
server certificates can be issued later (:func:`issue_server_cert`).

Keys are ECDSA P-256: generated in milliseconds and supported by every TLS stack in use here.
``cryptography`` is imported inside the functions, so importing this module costs nothing.
"""

from __future__ import annotations

import datetime as _dt
import ipaddress
import os
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

CA_FILE = "ca.pem"
CA_KEY_FILE = "ca.key"
CERT_FILE = "server.pem"
KEY_FILE = "server.key"

#: Names every generated certificate carries, so local runs and tests need no ``--host``.
DEFAULT_HOSTS = ("127.0.0.1", "localhost", "::1")


@dataclass(frozen=True)
class RunCerts:
    """Paths of a run's TLS files."""

    ca_file: Path
    cert_file: Path
    key_file: Path
    ca_key_file: Path

    @classmethod
    def in_dir(cls, out_dir: Path) -> RunCerts:
        out_dir = Path(out_dir)
        return cls(
            out_dir / CA_FILE, out_dir / CERT_FILE, out_dir / KEY_FILE, out_dir / CA_KEY_FILE
        )

    def exist(self) -> bool:
        return all(p.is_file() for p in (self.ca_file, self.cert_file, self.key_file))


def default_hosts(*extra: str) -> list[str]:
    """Loopback names, this machine's hostname and ``extra``, without duplicates, in order."""
    hosts = [*DEFAULT_HOSTS, socket.gethostname(), *extra]
    out: list[str] = []
    for h in hosts:
        h = h.strip()
        if h and h not in ("0.0.0.0", "::") and h not in out:
            out.append(h)
    return out


def _write(path: Path, data: bytes, private: bool) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def _san(hosts: Iterable[str]):
    from cryptography import x509

    names = []
    for h in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(h.strip("[]"))))
        except ValueError:
            names.append(x509.DNSName(h))
    return x509.SubjectAlternativeName(names)


def _key():
    from cryptography.hazmat.primitives.asymmetric import ec

    return ec.generate_private_key(ec.SECP256R1())


def _pem_key(key) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _pem_cert(cert) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return cert.public_bytes(serialization.Encoding.PEM)


def create_ca(name: str = "AstraFlow run CA", days: int = 3650):
    """(key, certificate) of a new CA that may sign server certificates only."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import NameOID

    key = _key()
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = _dt.datetime.now(_dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _dt.timedelta(minutes=5))
        .not_valid_after(now + _dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )  # fmt: skip
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return key, cert


def issue_server_cert(ca_key, ca_cert, hosts: Iterable[str], days: int = 825):
    """(key, certificate) of a TLS server certificate for ``hosts`` (names or IPs), signed by
    the CA."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    hosts = list(hosts)
    if not hosts:
        raise ValueError("a server certificate needs at least one host name or IP address")
    key = _key()
    now = _dt.datetime.now(_dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _dt.timedelta(minutes=5))
        .not_valid_after(now + _dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_san(hosts), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    return key, cert


def create_run_certs(out_dir: Path, hosts: Iterable[str], *, overwrite: bool = False) -> RunCerts:
    """Write ``ca.pem``/``ca.key`` and ``server.pem``/``server.key`` (for ``hosts``) to
    ``out_dir``; keys are mode 0600. Refuses to replace existing files unless ``overwrite``."""
    files = RunCerts.in_dir(out_dir)
    present = [
        p for p in (files.ca_file, files.ca_key_file, files.cert_file, files.key_file) if p.exists()
    ]
    if present and not overwrite:
        raise FileExistsError(
            f"{', '.join(str(p) for p in present)} already exist; remove them or pass --force"
        )
    ca_key, ca_cert = create_ca()
    key, cert = issue_server_cert(ca_key, ca_cert, hosts)
    _write(files.ca_key_file, _pem_key(ca_key), private=True)
    _write(files.ca_file, _pem_cert(ca_cert), private=False)
    _write(files.key_file, _pem_key(key), private=True)
    _write(files.cert_file, _pem_cert(cert), private=False)
    return files


def cert_hosts(cert_file: Path) -> list[str]:
    """The subject alternative names of a PEM certificate (for messages and tests)."""
    from cryptography import x509

    cert = x509.load_pem_x509_certificate(Path(cert_file).read_bytes())
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return []
    return [str(v) for v in san.get_values_for_type(x509.DNSName)] + [
        str(v) for v in san.get_values_for_type(x509.IPAddress)
    ]
