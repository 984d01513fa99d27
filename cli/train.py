"""`astraflow train RECIPE`."""

from __future__ import annotations

from pathlib import Path

import typer

from cli.common import load_recipe_or_exit, unavailable


def train(
    recipe: Path = typer.Argument(..., help="TOML recipe"),
    set_: list[str] = typer.Option([], "--set", help="Override a key: a.b.c=value"),
    resume: bool = typer.Option(False, "--resume", help="Continue a stopped run from its run directory"),
) -> None:
    """Start the dataflow service, rollout nodes and trainers of a recipe and train."""
    load_recipe_or_exit(recipe, set_)
    unavailable("Training (`astraflow train`)")
