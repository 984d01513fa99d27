"""TLS settings shared by every service and client: a certificate and key to serve HTTPS with, a
CA file to verify against.

Why here: the dataflow service, the trainer's weight server, the rollout node, the launcher and the
CLI all speak HTTP to each other; one place decides how a CA file becomes an ``ssl.SSLContext`` and
how a bad file is reported (named, with the flag or variable it came from), instead of each client
passing ``verify=`` its own way.

Clients verify against, in order: the CA file they are given, ``$ASTRAFLOW_CA_FILE``, the system's
trust store (httpx's default). Plain ``http://`` URLs ignore all of it.
"""

from __future__ import annotations

import os
import ssl
from dataclasses import dataclass
from pathlib import Path

from astraflow.errors import AstraFlowError

CA_ENV = "ASTRAFLOW_CA_FILE"
CERT_ENV = "ASTRAFLOW_TLS_CERT"
KEY_ENV = "ASTRAFLOW_TLS_KEY"


class TLSConfigError(AstraFlowError, ValueError):
    """A certificate, key or CA file that is missing or cannot be loaded."""


def _readable(path: str | Path, what: str) -> Path:
    p = Path(path).expanduser()
    if not p.is_file():
        raise TLSConfigError(f"{what}: file {str(p)!r} does not exist")
    try:
        p.read_bytes()
    except OSError as exc:
        raise TLSConfigError(f"{what}: cannot read {str(p)!r}: {exc}") from exc
    return p


@dataclass(frozen=True)
class ServerTLS:
    """Certificate chain and private key (PEM) a service serves HTTPS with."""

    cert_file: Path
    key_file: Path

    @classmethod
    def resolve(
        cls,
        cert: str | Path | None,
        key: str | Path | None,
        *,
        cert_flag: str = "--tls-cert",
        key_flag: str = "--tls-key",
    ) -> ServerTLS | None:
        """Checked settings, or None when neither is given. Loads the pair once so a wrong file
        fails at start-up with its name, not at the first handshake."""
        if not cert and not key:
            return None
        if not cert or not key:
            given, missing = (cert_flag, key_flag) if cert else (key_flag, cert_flag)
            raise TLSConfigError(f"{given} is given but {missing} is not: HTTPS needs both")
        tls = cls(
            _readable(cert, f"TLS certificate ({cert_flag})"),
            _readable(key, f"TLS key ({key_flag})"),
        )
        try:
            ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(
                str(tls.cert_file), str(tls.key_file)
            )
        except ssl.SSLError as exc:
            raise TLSConfigError(
                f"cannot use {cert_flag} {str(tls.cert_file)!r} with {key_flag} "
                f"{str(tls.key_file)!r} (not a PEM certificate and its matching key?): {exc}"
            ) from exc
        return tls

    def uvicorn_kwargs(self) -> dict[str, str]:
        return {"ssl_certfile": str(self.cert_file), "ssl_keyfile": str(self.key_file)}


def ca_path(ca_file: str | Path | None = None, *, flag: str = "--ca-file") -> Path | None:
    """The CA file to verify against (argument, else ``$ASTRAFLOW_CA_FILE``), checked; or None."""
    if ca_file:
        return _readable(ca_file, f"CA file ({flag})")
    env = os.environ.get(CA_ENV)
    if env:
        return _readable(env, f"CA file (${CA_ENV})")
    return None


def client_verify(
    ca_file: str | Path | None = None, *, flag: str = "--ca-file"
) -> ssl.SSLContext | bool:
    """``verify=`` for httpx: an SSL context trusting the run's CA, or True (system trust store)."""
    path = ca_path(ca_file, flag=flag)
    if path is None:
        return True
    try:
        return ssl.create_default_context(cafile=str(path))
    except ssl.SSLError as exc:
        raise TLSConfigError(f"CA file {str(path)!r} is not a PEM certificate: {exc}") from exc


def tls_failure(exc: BaseException) -> str | None:
    """A readable reason (with what to do) when ``exc`` comes from a TLS handshake, else None.

    Retrying a handshake that failed verification cannot succeed, so clients stop at once."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, ssl.SSLCertVerificationError):
            return (
                f"TLS certificate verification failed ({cur.verify_message or cur}); give the "
                f"run's CA file with --ca-file or ${CA_ENV}, and check that the certificate "
                "names the host in the URL"
            )
        if isinstance(cur, ssl.SSLError):
            hint = (
                " (the server speaks plain HTTP? use an http:// URL)"
                if "WRONG_VERSION_NUMBER" in str(cur) or "record layer" in str(cur)
                else ""
            )
            return f"TLS handshake failed: {cur}{hint}"
        cur = cur.__cause__ or cur.__context__
    text = str(exc)
    if "CERTIFICATE_VERIFY_FAILED" in text:
        return (
            f"TLS certificate verification failed ({text}); give the run's CA file with "
            f"--ca-file or ${CA_ENV}"
        )
    return None
