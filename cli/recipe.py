"""`astraflow recipe check|show`."""

from __future__ import annotations

from pathlib import Path

import typer
from astraflow.cli.common import console, err_console, load_recipe_or_exit
from rich.markup import escape

app = typer.Typer(help="Validate and inspect TOML recipes.", no_args_is_help=True)


@app.command()
def check(
    files: list[Path] = typer.Argument(..., help="Recipe files to validate"),
    set_: list[str] = typer.Option([], "--set", help="Override a key: a.b.c=value"),
    tasks: bool = typer.Option(
        True,
        "--tasks/--no-tasks",
        help="Load a few rows of every task set and validate them against the env "
        "(--no-tasks: the schema only, e.g. for a recipe whose data lives elsewhere)",
    ),
    models: bool = typer.Option(
        True,
        "--models/--no-models",
        help="Find each policy's model on this machine (a Hugging Face id in the local HF "
        "cache; nothing is downloaded) (--no-models: e.g. for a recipe whose models live on "
        "other hosts)",
    ),
    rows: int = typer.Option(3, "--rows", min=1, help="Rows of each task set to validate"),
) -> None:
    """Validate recipes; exit 1 after reporting every bad file, naming each bad key.

    Runs the checks `astraflow train` runs before it starts anything
    (astraflow.recipe.preflight): the schema (engine arguments included), the models, the
    workflow and agent, and a few rows of every task set."""
    from astraflow.recipe import RecipeError, load_recipe
    from astraflow.recipe.preflight import preflight

    failed = 0
    for f in files:
        try:
            recipe = load_recipe(f, set_)
        except RecipeError as exc:
            failed += 1
            err_console.print(
                f"[bold red]error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True
            )
            continue
        report = preflight(recipe, f, tasks=tasks, rows=rows, models=models)
        for warning in report.warnings:
            err_console.print(
                f"[yellow]warning:[/] {escape(warning)}", highlight=False, soft_wrap=True
            )
        if not report.ok:
            failed += 1
            for problem in report.problems:
                err_console.print(
                    f"[bold red]error:[/] {escape(str(f))}: {escape(str(problem))}",
                    highlight=False,
                    soft_wrap=True,
                )
            continue
        trainable = ", ".join(recipe.trainable_policies()) or "none"
        console.print(
            f"[green]ok[/] {escape(str(f))}  (policies: {', '.join(recipe.policies)}; "
            f"trainable: {trainable})",
            highlight=False,
            soft_wrap=True,
        )
    if failed:
        raise typer.Exit(1)


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
