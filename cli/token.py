"""`astraflow token --role node`: print a role-scoped token of a run.

Role tokens are derived from the run secret (:mod:`astraflow.protocol.auth`), so printing one needs
the secret: from ``--run-dir`` (``run_dir/run.secret``, written by ``astraflow train``), a file, or
``$ASTRAFLOW_TOKEN``. Only the token is printed, for ``$(astraflow token ...)``.
"""

from __future__ import annotations

from pathlib import Path

import typer


def token(
    role: str = typer.Option(
        "node",
        "--role",
        help="node (lease, push, fetch weights), trainer (batches, ack, "
        "publish) or admin (everything)",
    ),
    run_dir: Path = typer.Option(
        None, "--run-dir", help="Run directory of `astraflow train` (reads its run.secret)"
    ),
    secret_file: Path = typer.Option(None, "--secret-file", help="File holding the run secret"),
    secret: str = typer.Option(
        None,
        "--secret",
        envvar="ASTRAFLOW_TOKEN",
        help="The run secret itself (default: $ASTRAFLOW_TOKEN)",
        show_default=False,
    ),
) -> None:
    """Print the token of a role, derived from the run secret."""
    from astraflow.cli.common import fail

    from astraflow.protocol.auth import ROLES, derive_token, token_role

    if role not in ROLES:
        fail(f"--role must be one of {', '.join(ROLES)}, got {role!r}")
    if run_dir is not None or secret_file is not None:
        from astraflow.launch.security import read_secret

        try:
            if secret_file is not None:
                value = secret_file.read_text().strip()
                if not value:
                    fail(f"--secret-file {secret_file} is empty")
            else:
                value = read_secret(run_dir)
        except (OSError, ValueError) as exc:
            fail(str(exc))
    elif secret:
        value = secret
    else:
        fail("no run secret: pass --run-dir, --secret-file or --secret (or set ASTRAFLOW_TOKEN)")
    if token_role(value) is not None:
        fail(
            f"that is a {token_role(value)} token, not the run secret: role tokens are derived "
            "from the secret only"
        )
    typer.echo(derive_token(value, role))
