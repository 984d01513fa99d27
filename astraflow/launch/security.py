"""A run's credentials for the local launcher: the run secret, role tokens, TLS files.

Why a module of its own: the launcher starts each service with the token of its role and, with
``security.tls``, with a certificate (servers) and the CA (clients). All of that is environment
for the child processes (``ASTRAFLOW_TOKEN``, ``ASTRAFLOW_TLS_CERT``/``_KEY``,
``ASTRAFLOW_CA_FILE``, read by ``astraflow serve`` as defaults of its flags), so the launcher only
asks :meth:`RunSecurity.env` for each service's environment and gives its own client
``client_ca_file``; how a service is started or restarted stays the launcher's business.

The secret lives in ``run_dir/run.secret`` (mode 0600) and is reused by ``--resume``, so role
tokens handed to remote nodes stay valid for the whole run; ``astraflow token --role node
--run-dir DIR`` prints a node token from it.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from astraflow.protocol.auth import ADMIN, NODE, TRAINER, derive_token
from astraflow.protocol.tls import CA_ENV, CERT_ENV, KEY_ENV, ServerTLS
from astraflow.recipe import Recipe

SECRET_FILE = "run.secret"
TLS_DIR = "tls"
#: The dashboard's address with its read-only token (mode 0600), instead of printing the token.
DASHBOARD_URL_FILE = "dashboard.url"

#: Which role's token each kind of service runs with.
SERVICE_ROLES = {"dataflow": ADMIN, "trainer": TRAINER, "node": NODE}


def load_or_create_secret(run_dir: Path) -> str:
    """The run's secret from ``run_dir/run.secret``, created (0600) on first use."""
    path = Path(run_dir) / SECRET_FILE
    if path.is_file():
        secret = path.read_text().strip()
        if secret:
            return secret
    secret = secrets.token_urlsafe(32)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secret + "\n")
    os.replace(tmp, path)
    return secret


def dashboard_token(secret: str) -> str:
    """The dashboard's read-only token, derived from the run secret.

    Why not the secret: the dashboard's address is opened in browsers, kept in their history and
    was printed into every launcher log, and the secret is the admin token (stop the run, read
    every route). This token opens the dashboard and nothing else: it has no role on the dataflow
    service (``token_role`` of it is None and it is not the secret), and neither the secret nor a
    role token can be computed from it (HMAC-SHA256 under a label of its own).
    """
    if not secret:
        raise ValueError("cannot derive the dashboard token from an empty run secret")
    mac = hmac.new(secret.encode(), b"astraflow/dashboard/read-only", hashlib.sha256).digest()
    return "dashboard." + base64.urlsafe_b64encode(mac).decode().rstrip("=")


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically, readable by this user only (0600)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def protect_run_dir(run_dir: Path) -> None:
    """Make the run directory and its files this user's alone (0700 / 0600).

    Why: the run directory holds the store (every prompt, answer and node credential digest),
    the secret and the logs; created 0644 under a 022 umask, policy code running as another user
    (the code env's ``process`` backend runs it as ``nobody``) could read ``dataflow.db``. The
    directory's 0700 closes everything in it, later files included; the files' own 0600 keeps
    them closed when copied or when the directory is shared (a resumed run's files made before
    this existed are closed here too). The dataflow service creates its store 0600 itself.
    """
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(run_dir, 0o700)
    for path in run_dir.iterdir():
        if path.is_file() and not path.is_symlink():
            os.chmod(path, 0o600)


def read_secret(run_dir: Path) -> str:
    """The secret of an existing run (``astraflow token``); a clear error when there is none."""
    path = Path(run_dir) / SECRET_FILE
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} does not exist: not a run directory of `astraflow train`, or the run has "
            "not started yet"
        )
    secret = path.read_text().strip()
    if not secret:
        raise ValueError(f"{path} is empty")
    return secret


@dataclass
class RunSecurity:
    secret: str
    tls: ServerTLS | None = None
    ca_file: Path | None = None

    @classmethod
    def prepare(cls, recipe: Recipe, run_dir: Path) -> RunSecurity:
        """Secret, and with ``security.tls`` the certificate files (given, or generated in
        ``run_dir/tls`` for loopback, this host, ``dataflow.host`` and ``security.cert_hosts``;
        a resumed run reuses the generated ones)."""
        secret = load_or_create_secret(run_dir)
        protect_run_dir(run_dir)
        sec = recipe.security
        if not sec.tls:
            return cls(secret)
        if sec.cert_file is not None:
            tls = ServerTLS.resolve(
                sec.cert_file, sec.key_file, cert_flag="security.cert_file",
                key_flag="security.key_file",
            )  # fmt: skip
            return cls(secret, tls, Path(sec.ca_file) if sec.ca_file else None)
        from astraflow.launch.certs import RunCerts, create_run_certs, default_hosts

        files = RunCerts.in_dir(Path(run_dir) / TLS_DIR)
        if not files.exist():
            hosts = default_hosts(recipe.dataflow.host, *sec.cert_hosts)
            files = create_run_certs(files.ca_file.parent, hosts, overwrite=True)
        tls = ServerTLS.resolve(files.cert_file, files.key_file)
        return cls(secret, tls, Path(sec.ca_file) if sec.ca_file else files.ca_file)

    def token(self, role: str) -> str:
        """The run secret for admin (what the dataflow service needs), else the role's token."""
        return self.secret if role == ADMIN else derive_token(self.secret, role)

    def env(self, service: str, base: dict[str, str]) -> dict[str, str]:
        """``base`` with the token and TLS settings of ``service`` (dataflow, trainer or node).

        TLS variables the launcher does not set are removed, so a stray one in the user's shell
        cannot make one service speak HTTPS while the others expect HTTP."""
        env = {k: v for k, v in base.items() if k not in (CA_ENV, CERT_ENV, KEY_ENV)}
        env["ASTRAFLOW_TOKEN"] = self.token(SERVICE_ROLES[service])
        if self.tls is not None and service in ("dataflow", "trainer"):  # they serve HTTP(S)
            env[CERT_ENV] = str(self.tls.cert_file)
            env[KEY_ENV] = str(self.tls.key_file)
        if self.tls is not None and self.ca_file is not None and service in ("trainer", "node"):
            env[CA_ENV] = str(self.ca_file)
        return env

    @property
    def client_ca_file(self) -> str | None:
        """The CA the launcher's own client verifies the dataflow service against (with TLS)."""
        return str(self.ca_file) if self.tls is not None and self.ca_file else None
