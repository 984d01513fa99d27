"""A benchmark's output: the console, result tables, failure notes and the ``--json`` file."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import _stamp
from _records import EvalPoint
from _stats import Spread
from rich.console import Console
from rich.table import Table

if TYPE_CHECKING:
    from _results import RunResult

#: Wide enough for the result tables when the output is a file or a pipe (CI logs, ``| tee``).
console = Console(width=None if sys.stdout.isatty() else 160)


def fmt(value: float | None, spec: str = "{:.2f}", unit: str = "") -> str:
    return "-" if value is None else spec.format(value) + unit


def table(title: str, columns: Sequence[str], rows: Sequence[Sequence[str]]) -> Table:
    t = Table(title=title, title_justify="left")
    for i, col in enumerate(columns):
        t.add_column(col, justify="left" if i == 0 else "right")
    for row in rows:
        t.add_row(*row)
    return t


def spread_text(d: dict[str, Any], spec: str = "{:.1f}", unit: str = "") -> str:
    """A :func:`spread_json` dict as table text (median [min–max])."""
    return Spread(d["median"], d["min"], d["max"], d["n"]).text(spec, unit)


def print_ladder(title: str, systems: Sequence[str], ladder: dict[str, dict[str, Any]]) -> None:
    """The table of median seconds to each accuracy level (``ladder[level][system]``)."""
    if not ladder:
        return
    rows = [[lvl, *(fmt(t.get(s), "{:.0f}", "s") for s in systems)] for lvl, t in ladder.items()]
    console.print(table(title, ["accuracy", *systems], rows))


def print_failures(runs: Iterable[RunResult], notes: Iterable[str]) -> None:
    """A report's end: the error of every failed run, then the benchmark's notes."""
    for r in runs:
        if not r.ok:
            console.print(f"[red]{r.system} seed {r.seed} failed:[/] {r.error}")
    for note in notes:
        console.print(f"[dim]- {note}[/]")


def write_json(path: Path | str, payload: dict[str, Any]) -> Path:
    """The ``--json`` file, stamped (:mod:`_stamp`), with the harness's types made plain."""
    return _stamp.write_json(path, payload, default=_jsonable)


def _jsonable(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, (EvalPoint, Spread)):
        return asdict(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")
