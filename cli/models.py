"""`astraflow models build|list`."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from astraflow.cli.common import console, fail

from astraflow.models import tiny_arith, tiny_tools

app = typer.Typer(help="Built-in models.", no_args_is_help=True)


@app.command("list")
def list_models() -> None:
    """List the built-in models and whether their checkpoint is present."""
    from rich.table import Table

    from astraflow.models import BUILTIN_MODELS, BUILTIN_PREFIX

    table = Table(title="Built-in models")
    table.add_column("name")
    table.add_column("checkpoint")
    table.add_column("description")
    for model in BUILTIN_MODELS.values():
        present = (model.path / "model.safetensors").is_file()
        table.add_row(
            BUILTIN_PREFIX + model.name,
            str(model.path) if present else "[yellow]missing (run `astraflow models build`)[/]",
            model.description,
        )
    console.print(table)


@app.command()
def build(
    name: str = typer.Argument("tiny-arith", help="Built-in model to build."),
    seed: int = typer.Option(0, help="Seed of the initialisation and data order."),
    out: Optional[Path] = typer.Option(
        None, help="Output directory (default: the package's built-in checkpoint directory)."
    ),
    steps: Optional[int] = typer.Option(
        None,
        help="Most warm-start optimizer steps (0 = random init; default "
        f"{tiny_arith.DEFAULT_STEPS} for tiny-arith, {tiny_tools.DEFAULT_STEPS} for tiny-tools).",
    ),
    target_accuracy: float = typer.Option(
        0.25,
        help="tiny-arith: stop once greedy dev accuracy reaches this (0 = always run --steps).",
    ),
    eval_size: int = typer.Option(500, help="Test problems for the reported accuracy."),
) -> None:
    """Build a built-in model checkpoint deterministically (same seed and steps -> same bytes)."""
    from astraflow.models import BUILTIN_MODELS

    if name not in BUILTIN_MODELS:
        fail(f"unknown built-in model {name!r}; available: {', '.join(sorted(BUILTIN_MODELS))}")
    if steps is not None and steps < 0:
        fail(f"--steps must be >= 0, got {steps}")
    if eval_size < 1:
        fail(f"--eval-size must be >= 1, got {eval_size}")
    if not 0 <= target_accuracy <= 1:
        fail(f"--target-accuracy must be in [0, 1], got {target_accuracy}")

    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    builder = tiny_tools if name == "tiny-tools" else tiny_arith
    total = builder.DEFAULT_STEPS if steps is None else steps
    target = out if out is not None else BUILTIN_MODELS[name].path
    with Progress(
        TextColumn("[bold]warm start[/]"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total} steps"),
        TextColumn("loss {task.fields[loss]}"),
        TimeElapsedColumn(),
        console=console,
    ) as progress:
        task = progress.add_task("train", total=total, loss="-")

        def on_step(step: int, loss: float) -> None:
            progress.update(task, completed=step, loss=f"{loss:.3f}")

        if builder is tiny_tools:
            result = tiny_tools.build(
                target, seed=seed, steps=total, on_step=on_step, eval_size=min(eval_size, 500)
            )
        else:
            result = tiny_arith.build(
                target,
                seed=seed,
                steps=total,
                on_step=on_step,
                target_accuracy=target_accuracy,
                eval_size=eval_size,
            )
        progress.update(task, total=result.steps or total, completed=result.steps)
    console.print(
        f"[green]built[/] {name} -> {result.out_dir}  "
        f"({result.params:,} params, {result.size_bytes / 1e6:.1f} MB, {result.steps} steps)"
    )
    if isinstance(result, tiny_tools.ToolsBuildResult):
        for label, rates in (("sampled (T=1)", result.sampled), ("greedy", result.greedy)):
            console.print(
                f"{label} on calculator test: success {rates.success:.1%}, correct calls "
                f"{rates.correct_call:.1%}, other calls {rates.other_call:.1%}, "
                f"no call {rates.no_call:.1%}"
            )
    else:
        console.print(
            f"greedy accuracy on arith test (level {tiny_arith.ARITH_LEVEL}): "
            f"{result.greedy_accuracy:.1%}; sampled (T=1): {result.sampled_accuracy:.1%}; "
            f"problems with mixed right/wrong samples (of 8): {result.mixed_group_fraction:.1%}"
        )
