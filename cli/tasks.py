"""`astraflow tasks list|show`: every task set, built in or from an ``astraflow.tasks`` plugin."""

from __future__ import annotations

import json

import typer
from astraflow.cli.common import console, err_console, fail
from rich.markup import escape
from rich.table import Table

app = typer.Typer(help="Task sets: built-in and plugins.", no_args_is_help=True)


def _registry():
    from astraflow.tasks.catalog import default_task_sets

    reg = default_task_sets()
    for _name, error in sorted(reg.errors.items()):
        err_console.print(f"[yellow]warning:[/] {escape(error)}", highlight=False, soft_wrap=True)
    return reg


def _row(info) -> dict:
    return {
        "name": info.name,
        "splits": list(info.splits),
        "default_env": info.default_env or None,
        "source": info.source,
        "description": info.description,
    }


@app.command("list")
def list_(
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table"),
) -> None:
    """Every task set with its splits, the env its payloads are made for and its package."""
    rows = [_row(i) for i in _registry().infos()]
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    # Four columns that wrap (never truncate) so ids stay whole at 80 columns; the package a
    # set comes from is named in its description when it is not astraflow itself.
    table = Table(title="task sets")
    for col in ("name", "splits", "env", "description"):
        table.add_column(col, overflow="fold")
    for r in rows:
        source = "" if r["source"] == "astraflow" else f" (from {r['source']})"
        table.add_row(
            r["name"],
            ", ".join(r["splits"]),
            r["default_env"] or "(any)",
            escape(r["description"] + source),
        )
    console.print(table)


@app.command()
def show(
    name: str = typer.Argument(..., help="Task set name (see `astraflow tasks list`)"),
    split: str | None = typer.Option(None, "--split", help="Split to sample (default: the first)"),
    rows: int = typer.Option(3, "--rows", min=0, help="Payloads to print (0: none)"),
    kwarg: list[str] = typer.Option([], "--kwarg", help="Loader kwarg key=value (e.g. path=...)"),
    as_json: bool = typer.Option(False, "--json", help="Print JSON"),
) -> None:
    """A task set's details and its first payloads."""
    from astraflow.cli.envs import _parse_kwargs
    from astraflow.tasks.base import UnknownTaskSetError

    reg = _registry()
    try:
        info = reg.info(name)
    except UnknownTaskSetError as exc:
        fail(str(exc))
    chosen = split or info.splits[0]
    payloads: list = []
    if rows:
        try:
            payloads = reg.load(name, chosen, limit=rows, **_parse_kwargs(kwarg))
        except Exception as exc:  # a missing file or kwarg: say so, with the set and split
            fail(f"task set {name!r} split {chosen!r}: {type(exc).__name__}: {exc}")
    if as_json:
        print(json.dumps({**_row(info), "split": chosen, "rows": payloads}, indent=2, default=str))
        return
    console.print(f"[bold]{escape(info.name)}[/]  ({escape(info.source)})", highlight=False)
    console.print(escape(info.description), highlight=False)
    console.print(f"splits: {', '.join(info.splits)}", highlight=False)
    console.print(f"env: {info.default_env or '(any: name it in the recipe)'}", highlight=False)
    for p in payloads:
        console.print(f"[dim]{escape(chosen)}[/] {escape(json.dumps(p, default=str)[:400])}")
