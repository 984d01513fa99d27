"""`astraflow certs create OUT_DIR --host ...`: a CA and a server certificate for a run's HTTPS.

The services take the certificate and key (``--tls-cert``/``--tls-key`` or ``[security]``
``cert_file``/``key_file``); clients verify against the CA (``--ca-file``, ``$ASTRAFLOW_CA_FILE``,
``security.ca_file``). ``cryptography`` is imported inside the command, so ``--help`` stays fast.
"""

from __future__ import annotations

from pathlib import Path

import typer

app = typer.Typer(help="TLS certificates for a run's services.", no_args_is_help=True)


@app.command()
def create(
    out_dir: Path = typer.Argument(
        ..., help="Directory for ca.pem, ca.key, server.pem, server.key"
    ),
    hosts: list[str] = typer.Option(
        [],
        "--host",
        help="Host name or IP the services are reached by (repeat); loopback and this machine's "
        "hostname are always included",
    ),
    force: bool = typer.Option(False, "--force", help="Replace existing files"),
) -> None:
    """Create a CA and a server certificate (signed by it) for the given hosts."""
    from astraflow.cli.common import console, fail

    from astraflow.launch.certs import create_run_certs, default_hosts

    names = default_hosts(*hosts)
    try:
        files = create_run_certs(out_dir, names, overwrite=force)
    except (FileExistsError, ValueError, OSError) as exc:
        fail(str(exc))
    console.print(
        f"CA           {files.ca_file}   (give to clients: --ca-file)\n"
        f"CA key       {files.ca_key_file}   (keep private)\n"
        f"certificate  {files.cert_file}   (services: --tls-cert)\n"
        f"key          {files.key_file}   (services: --tls-key; keep private)\n"
        f"hosts        {', '.join(names)}",
        highlight=False,
    )
