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
    rows: int = typer.Option(3, "--rows", min=1, help="Rows of each task set to validate"),
) -> None:
    """Validate recipes; exit 1 after reporting every bad file, naming each bad key."""
    from astraflow.recipe import RecipeError, load_recipe

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
        if not _workflow_ok(f, recipe) or not _agent_ok(f, recipe):
            failed += 1
            continue
        if tasks and not _tasks_ok(f, recipe, rows):
            failed += 1
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


def _error(path: Path, message: str) -> bool:
    err_console.print(
        f"[bold red]error:[/] {escape(str(path))}: {escape(message)}",
        highlight=False,
        soft_wrap=True,
    )
    return False


def _workflow_ok(path: Path, recipe) -> bool:
    """Resolve ``workflow.name`` as every rollout node will: a typo there otherwise fails every
    episode of the run (the node pushes them as errors and the run stops as stalled)."""
    from astraflow.rollout.workflows import default_workflows

    registry = default_workflows()
    try:
        registry.get(recipe.workflow.name)
    except Exception as exc:
        return _error(path, f"workflow.name: {exc}")
    return True


def _agent_ok(path: Path, recipe) -> bool:
    """Import ``workflow.agent`` and check its signature, as every rollout node will at start-up,
    and check the model names it writes out against the roles: a typo there otherwise surfaces
    only as a failed episode on each node after the run started."""
    if not recipe.workflow.agent:
        return True
    from astraflow.rollout.workflows.base import WorkflowError
    from astraflow.rollout.workflows.openai_agent import literal_model_names, load_agent

    try:
        fn, _ = load_agent(recipe.workflow.agent)
    except WorkflowError as exc:
        return _error(path, str(exc))
    roles = sorted(recipe.workflow.roles)
    unknown = sorted(literal_model_names(fn) - set(roles))
    if unknown:
        return _error(
            path,
            f"workflow.agent {recipe.workflow.agent!r} asks for model(s) {', '.join(map(repr, unknown))}"
            f", but the model names an agent may use are the workflow roles: {', '.join(roles)} "
            "(map more roles to policies in [workflow.roles], or call model=ROLE)",
        )
    return True


def _tasks_ok(path: Path, recipe, rows: int) -> bool:
    """Resolve every task set of ``recipe`` and validate a few rows against its env."""
    from astraflow.tasks.catalog import default_task_sets
    from astraflow.tasks.check import check_sets

    sets = default_task_sets()
    for _name, error in sorted(sets.errors.items()):
        err_console.print(f"[yellow]warning:[/] {escape(error)}", highlight=False, soft_wrap=True)
    bad = [c for c in check_sets(recipe, rows=rows, task_sets=sets) if c.error]
    for c in bad:
        err_console.print(
            f"[bold red]error:[/] {escape(str(path))}: {escape(c.error or '')}",
            highlight=False,
            soft_wrap=True,
        )
    return not bad


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
