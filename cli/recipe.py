"""`astraflow recipe check|show`."""

from __future__ import annotations

from pathlib import Path

import typer

from cli.common import console, load_recipe_or_exit

app = typer.Typer(help="Validate and inspect TOML recipes.", no_args_is_help=True)


@app.command()
def check(
    files: list[Path] = typer.Argument(..., help="Recipe files to validate"),
    set_: list[str] = typer.Option([], "--set", help="Override a key: a.b.c=value"),
) -> None:
    """Validate recipes; exit non-zero with messages naming each bad key."""
    for f in files:
        recipe = load_recipe_or_exit(f, set_)
        trainable = ", ".join(recipe.trainable_policies()) or "none"
        console.print(f"[green]ok[/] {f}  (policies: {', '.join(recipe.policies)}; trainable: {trainable})")


@app.command()
def show(
    file: Path = typer.Argument(..., help="Recipe file"),
    set_: list[str] = typer.Option([], "--set", help="Override a key: a.b.c=value"),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of TOML"),
) -> None:
    """Print the fully resolved recipe (defaults filled in, overrides applied)."""
    from astraflow.recipe import recipe_to_toml

    recipe = load_recipe_or_exit(file, set_)
    if as_json:
        print(recipe.model_dump_json(indent=2))
    else:
        print(recipe_to_toml(recipe), end="")
