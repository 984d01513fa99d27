"""`astraflow eval agentbench`: AgentBench v0.2 (dbbench, os_interaction, alfworld) against a policy.

The episodes run through the training path (workflow, engine, env runner); see
:mod:`astraflow.rollout.evaluation.agentbench`. This module parses flags and renders the report.
"""

from __future__ import annotations

from pathlib import Path

import typer

from cli.common import console, fail

app = typer.Typer(help="Evaluate policies on benchmarks.", no_args_is_help=True)


@app.command()
def agentbench(
    policy: str = typer.Option(
        "builtin:tiny-arith",
        "--policy",
        help="builtin:NAME, a Hugging Face id or local path, or a run directory (latest checkpoint)",
    ),
    engine: str = typer.Option("transformers", "--engine", help="transformers | vllm | openai"),
    tasks: str = typer.Option(
        "dbbench,os",
        "--tasks",
        help="Comma-separated: dbbench, os, alfworld (needs astraflow[alfworld])",
    ),
    split: str = typer.Option("dev", "--split", help="dev | standard | train (os, alfworld)"),
    data: Path | None = typer.Option(
        None,
        "--data",
        help="AgentBench data/ folder (default: $ASTRAFLOW_AGENTBENCH_DATA or shared/data/agentbench)",
    ),
    db: str = typer.Option(
        "sqlite", "--db", help="sqlite (embedded) or mysql://user:pass@host:port"
    ),
    sandbox: str = typer.Option("auto", "--sandbox", help="OS sandbox: auto | overlay | docker"),
    concurrency: int = typer.Option(4, "--concurrency", min=1, help="Samples run at once"),
    limit: int | None = typer.Option(None, "--limit", min=1, help="First N samples per family"),
    out: Path | None = typer.Option(None, "--out", help="Write the JSON report here"),
    agent: str = typer.Option(
        "policy", "--agent", help="policy (the model) or oracle (replay reference solutions)"
    ),
    max_tokens: int = typer.Option(512, "--max-tokens", min=1, help="New tokens per turn"),
    temperature: float = typer.Option(0.0, "--temperature", min=0.0, help="0 = greedy"),
    overflow: str = typer.Option(
        "limit",
        "--overflow",
        help="Context overflow: limit (AgentBench's 'agent context limit') or truncate (keep the "
        "latest tokens; for small-context models)",
    ),
    device: str = typer.Option("auto", "--device", help="Engine device: auto | cpu | cuda[:N]"),
    engine_arg: list[str] = typer.Option(
        [], "--engine-arg", help="KEY=VALUE passed to the engine (e.g. gpu_memory_utilization=0.8)"
    ),
) -> None:
    """Run AgentBench's dbbench, os_interaction and alfworld tasks and report AgentBench's metrics."""
    import asyncio

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from astraflow.rollout.evaluation.agentbench import (
        FAMILIES,
        EvalConfig,
        evaluate,
        oracle_agent,
    )
    from envs.agentbench import data as ab_data
    from envs.agentbench.report import write_report

    families = tuple(t.strip() for t in tasks.split(",") if t.strip())
    bad = [f for f in families if f not in FAMILIES]
    if bad or not families:
        fail(f"--tasks takes a comma-separated subset of {', '.join(FAMILIES)}; got {tasks!r}")
    splits = (*ab_data.SPLITS, "train")
    if split not in splits:
        fail(f"--split must be one of {', '.join(splits)}; got {split!r}")
    if agent not in ("policy", "oracle"):
        fail(f"--agent must be policy or oracle; got {agent!r}")
    if overflow not in ("limit", "truncate"):
        fail(f"--overflow must be limit or truncate; got {overflow!r}")
    try:
        data_dir = ab_data.resolve_data_dir(data)
        engine_args = parse_engine_args(engine_arg)
    except ValueError as exc:
        fail(str(exc))
    config = EvalConfig(
        tasks=families,
        split=split,
        data_dir=str(data_dir),
        db=db,
        sandbox=sandbox,
        concurrency=concurrency,
        limit=limit,
    )

    async def main():
        if agent == "oracle":
            runner = oracle_agent()
        else:
            runner = _policy_agent(
                policy, engine, device, engine_args, max_tokens, temperature, overflow
            )
        progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("passed {task.fields[passed]}"),
            TimeElapsedColumn(),
            console=console,
        )
        bars: dict[str, int] = {}
        passed: dict[str, int] = {}

        def on_start(family: str, n: int) -> None:
            passed[family] = 0
            bars[family] = progress.add_task(family, total=n, passed=0)

        def on_result(res) -> None:
            passed[res.family] += int(res.passed)
            progress.update(bars[res.family], advance=1, passed=passed[res.family])

        try:
            with progress:
                return await evaluate(runner, config, on_start, on_result)
        finally:
            await runner.close()

    try:
        report = asyncio.run(main())
    except (ValueError, RuntimeError, OSError, ImportError) as exc:
        fail(f"{type(exc).__name__}: {exc}")
    report["meta"]["policy"] = policy if agent == "policy" else None
    if agent == "policy":
        report["meta"]["checkpoint"] = resolve_policy(policy)
    for table in render_tables(report):
        console.print(table)
    if out is not None:
        write_report(report, out)
        console.print(f"report written to {out}")


def _policy_agent(
    policy: str,
    engine: str,
    device: str,
    engine_args: dict,
    max_tokens: int,
    temperature: float,
    overflow: str,
):
    """The policy's engine, serving every episode (what a rollout node would run)."""
    from astraflow.rollout.evaluation.agents import EngineAgent

    model_path = resolve_policy(policy)
    eng = _make_engine(engine, model_path, device, engine_args)
    return EngineAgent(
        eng,
        name=f"policy:{policy}",
        max_tokens=max_tokens,
        temperature=temperature,
        overflow=overflow,
    )


def render_tables(report: dict) -> list:
    """rich tables: one per family (summary, per-type accuracy for dbbench and alfworld, status
    histogram)."""
    from rich.table import Table

    tables = []
    for family, fam in report["tasks"].items():
        t = Table(
            title=f"AgentBench {family} ({report['meta'].get('split')}, agent "
            f"{report['meta'].get('agent')})",
            show_lines=False,
        )
        t.add_column("metric")
        t.add_column("value", justify="right")
        t.add_row("samples", str(fam["total"]))
        t.add_row("skipped", str(fam["skipped"]))
        t.add_row("passed", str(fam["passed"]))
        t.add_row("success rate", f"{fam['success_rate']:.1%}")
        t.add_row("average turns", f"{fam['avg_turns']:.2f}")
        if family == "dbbench":
            t.add_row("overall_cat_accuracy", f"{fam['overall_cat_accuracy']:.1%}")
        for typ, slot in fam.get("by_type", {}).items():
            acc = slot["passed"] / slot["total"] if slot["total"] else 0.0
            t.add_row(f"  {typ}", f"{slot['passed']}/{slot['total']} ({acc:.0%})")
        for status, count in sorted(fam["status"].items()):
            t.add_row(f"status: {status}", str(count))
        tables.append(t)
    return tables


def _make_engine(engine: str, model_path: str, device: str, engine_args: dict):
    """An engine from ``astraflow.rollout.engines.make_engine`` (the rollout nodes' factory)."""
    from astraflow.rollout.engines import make_engine

    kwargs = dict(engine_args)
    if engine == "transformers":
        kwargs.setdefault("device", device)
        model_path = local_checkpoint(model_path)
    return make_engine(engine, model_path, **kwargs)


def local_checkpoint(model: str) -> str:
    """A Hugging Face id -> its snapshot in the local HF cache (never downloads); paths unchanged."""
    if Path(model).exists() or model.count("/") != 1:
        return model
    try:
        from huggingface_hub import snapshot_download

        return snapshot_download(model, local_files_only=True)
    except Exception as exc:
        raise FileNotFoundError(
            f"{model!r} is not a local path and not in the local Hugging Face cache ({exc}); "
            f"download it first, e.g. `huggingface-cli download {model}`"
        ) from None


def parse_engine_args(items: list[str]) -> dict:
    """``KEY=VALUE`` pairs; VALUE is read as JSON when it parses (numbers, true, lists), else text."""
    import json

    out: dict = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--engine-arg expects KEY=VALUE, got {item!r}")
        try:
            out[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            out[key.strip()] = value
    return out


def resolve_policy(policy: str) -> str:
    """builtin:NAME -> its path; a run directory -> its latest checkpoint; anything else as is.

    A checkpoint is a directory holding ``config.json``; the latest is the one with the highest
    number in its name (the trainer's checkpoint-120 > checkpoint-80), newest modification time
    breaking ties.
    """
    import re

    from astraflow.models import resolve_model

    path = Path(policy)
    if policy.startswith("builtin:") or not path.is_dir():
        return resolve_model(policy)
    if (path / "config.json").is_file():
        return str(path)
    found = [p.parent for p in path.glob("**/config.json") if len(p.relative_to(path).parts) <= 4]
    if not found:
        raise FileNotFoundError(
            f"{path} is neither a checkpoint nor a run directory with checkpoints"
        )

    def key(p: Path):
        nums = [int(n) for n in re.findall(r"\d+", p.name)]
        return (nums[-1] if nums else -1, p.stat().st_mtime)

    return str(max(found, key=key))
