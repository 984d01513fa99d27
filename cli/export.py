"""`astraflow export`: a trainer checkpoint as a standalone model (LoRA merged).

A LoRA checkpoint holds only the adapter; the export merges it into its base model so that
``AutoModelForCausalLM.from_pretrained(OUT)`` (or vLLM) loads it with no peft installed.
"""

from __future__ import annotations

from pathlib import Path

import typer


def export(
    source: Path = typer.Argument(
        ..., help="A checkpoint folder (checkpoint-N) or a run directory (its newest checkpoint)"
    ),
    out: Path = typer.Argument(..., help="Folder to write the model into"),
    policy: str = typer.Option(
        None, "--policy", help="Policy whose checkpoint to export, with a run directory"
    ),
) -> None:
    """Write a from_pretrained-loadable model from a trainer checkpoint."""
    from astraflow.cli.common import fail

    checkpoint = source
    if (source / "checkpoints").is_dir():
        from astraflow.trainer.checkpoints import newest_complete

        policies = sorted(p.name for p in (source / "checkpoints").iterdir() if p.is_dir())
        if policy is None and len(policies) == 1:
            policy = policies[0]
        if policy not in policies:
            fail(f"--policy: expected one of {', '.join(policies) or '(none)'} for {source}")
        found = newest_complete(source / "checkpoints" / policy)
        if found is None:
            fail(f"{source}: no complete checkpoint of policy {policy!r} yet")
        checkpoint = found[0]
    from astraflow.trainer.export import export_checkpoint

    try:
        written = export_checkpoint(checkpoint, out)
    except ValueError as exc:
        fail(str(exc))
    typer.echo(f"exported {checkpoint} -> {written}")
