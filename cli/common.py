"""Helpers shared by the CLI modules: console, errors, the 'not yet available' exit, the typed
client of a running job's dataflow service."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import typer
from rich.console import Console

from astraflow.launch.text import safe_text

if TYPE_CHECKING:
    from astraflow.protocol.client import SyncDataflowClient

console = Console()
err_console = Console(stderr=True)

#: Exit code for a command whose capability is not available (yet) in this build.
EXIT_UNAVAILABLE = 2


def fail(message: str, code: int = 1) -> NoReturn:
    # The message is plain text (recipe errors contain "[section]"), never rich markup; it may
    # quote what nodes sent (an episode error, a service log's tail): cleaned of control
    # characters and escaped by the one helper (astraflow.launch.text.safe_text)
    err_console.print(
        f"[bold red]error:[/] {safe_text(message, None, multiline=True)}",
        highlight=False,
        soft_wrap=True,
    )
    raise typer.Exit(code)


def unavailable(what: str) -> NoReturn:
    fail(f"{what} is not available in this build yet.", EXIT_UNAVAILABLE)


def load_recipe_or_exit(path, overrides=None):
    from astraflow.recipe import RecipeError, load_recipe

    try:
        return load_recipe(path, overrides or [])
    except RecipeError as exc:
        fail(str(exc))


#: ``--ca-file`` of the commands that talk to a running job's service.
CA_FILE_OPTION = typer.Option(
    None, "--ca-file", envvar="ASTRAFLOW_CA_FILE", help="CA to verify an https:// URL against"
)


def dataflow_client(
    url: str, token: str, ca_file: Path | None, *, timeout: float = 10.0, retries: int = 1
) -> SyncDataflowClient:
    """The typed client of the dataflow service at ``url``; a CA file that cannot be used is a
    clear exit naming the flag, never a traceback."""
    from astraflow.protocol.client import SyncDataflowClient
    from astraflow.protocol.tls import TLSConfigError

    try:
        return SyncDataflowClient(
            url, token, timeout=timeout, retries=retries, ca_file=str(ca_file) if ca_file else None
        )
    except TLSConfigError as exc:
        fail(str(exc))
