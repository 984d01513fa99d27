"""Helpers shared by the CLI modules: console, errors, the 'not yet available' exit."""

from __future__ import annotations

from typing import NoReturn

import typer
from rich.console import Console
from rich.markup import escape

console = Console()
err_console = Console(stderr=True)

#: Exit code for a command whose capability is not available (yet) in this build.
EXIT_UNAVAILABLE = 2


def fail(message: str, code: int = 1) -> NoReturn:
    # The message is plain text (recipe errors contain "[section]"), never rich markup.
    err_console.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def unavailable(what: str) -> NoReturn:
    fail(f"{what} is not available in this build yet.", EXIT_UNAVAILABLE)


def load_recipe_or_exit(path, overrides=None):
    from astraflow.recipe import RecipeError, load_recipe

    try:
        return load_recipe(path, overrides or [])
    except RecipeError as exc:
        fail(str(exc))
