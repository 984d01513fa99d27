"""`astraflow eval run` (any env, any task set) and `astraflow eval agentbench` (AgentBench v0.2:
dbbench, os_interaction, alfworld).

The episodes run through the training path (workflow, engine, env runner); see
:mod:`astraflow.rollout.evaluation`. This module parses flags and renders the reports.
"""

from __future__ import annotations

from pathlib import Path

import typer
from astraflow.cli.common import console, fail

from astraflow.engine_kinds import ENGINE_KINDS

app = typer.Typer(help="Evaluate policies on benchmarks.", no_args_is_help=True)


@app.command("run")
def run(
    policy: str = typer.Option(
        ...,
        "--policy",
        help="builtin:NAME, a Hugging Face id or local path, or a run directory (latest checkpoint)",
    ),
    env: str = typer.Option(..., "--env", help="Env id (see `astraflow envs list`)"),
    tasks: str = typer.Option(
        ..., "--tasks", help="SET or SET:SPLIT (see `astraflow tasks list`); split default test"
    ),
    limit: int | None = typer.Option(None, "--limit", min=1, help="First N tasks of the split"),
    samples: int = typer.Option(1, "--samples", min=1, help="Attempts per task (pass@k, k<=K)"),
    engine: str = typer.Option("transformers", "--engine", help=" | ".join(ENGINE_KINDS)),
    device: str = typer.Option("auto", "--device", help="Engine device: auto | cpu | cuda[:N]"),
    engine_arg: list[str] = typer.Option([], "--engine-arg", help="KEY=VALUE for the engine"),
    max_tokens: int = typer.Option(256, "--max-tokens", min=1, help="New tokens per turn"),
    temperature: float | None = typer.Option(
        None, "--temperature", min=0.0, help="Default: 0 (greedy) with one sample, else 1.0"
    ),
    top_p: float = typer.Option(1.0, "--top-p", min=0.0, max=1.0),
    max_turns: int = typer.Option(1, "--max-turns", min=1, help="Turns per episode"),
    workflow: str = typer.Option(
        "single_agent", "--workflow", help="Workflow the episodes run (--agent: openai_agent)"
    ),
    agent: str | None = typer.Option(
        None,
        "--agent",
        help="openai_agent workflow: the agent, 'package.module:function' or 'file.py:function'",
    ),
    tool_parser: str = typer.Option(
        "auto",
        "--tool-parser",
        help="How the policy writes tool calls (hermes, ...; auto: its template)",
    ),
    kwarg: list[str] = typer.Option(
        [], "--kwarg", help="Task-set loader KEY=VALUE (e.g. path=tasks.jsonl)"
    ),
    env_kwarg: list[str] = typer.Option([], "--env-kwarg", help="Env KEY=VALUE"),
    concurrency: int = typer.Option(8, "--concurrency", min=1, help="Episodes run at once"),
    seed: int = typer.Option(0, "--seed", min=0, help="Seed of generated task sets"),
    out: Path | None = typer.Option(
        None,
        "--out",
        help="JSON report (default: RUN_DIR/eval/SET-SPLIT.json for a run "
        "directory, else eval-SET-SPLIT.json here)",
    ),
) -> None:
    """Score a policy on any registered env and task set: accuracy, pass@k, turns, tokens."""
    import asyncio
    import json

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from astraflow.rollout.evaluation.tasksets import TaskSetEval, evaluate_task_set

    name, _, split = tasks.partition(":")
    if not name:
        fail(f"--tasks expects SET or SET:SPLIT, got {tasks!r}")
    split = split or "test"
    if agent and workflow == "single_agent":
        workflow = "openai_agent"  # an agent runs under the workflow that calls it
    if workflow == "openai_agent" and not agent:
        fail("--workflow openai_agent needs --agent package.module:function (or file.py:function)")
    if agent:
        from astraflow.rollout.workflows.base import WorkflowError
        from astraflow.rollout.workflows.openai_agent import load_agent

        try:
            load_agent(agent)
        except WorkflowError as exc:
            fail(str(exc))
    temp = temperature if temperature is not None else (0.0 if samples == 1 else 1.0)
    if samples > 1 and temp == 0.0:
        fail("--samples > 1 with --temperature 0 gives K identical attempts; use a temperature > 0")
    try:
        engine_args = parse_engine_args(engine_arg)
        task_kwargs = parse_engine_args(kwarg, "--kwarg")
        env_kwargs = parse_engine_args(env_kwarg, "--env-kwarg")
        config = TaskSetEval(
            env=env, task_set=name, split=split, limit=limit, samples=samples,
            concurrency=concurrency, max_turns=max_turns, workflow=workflow, seed=seed,
            task_kwargs=task_kwargs, env_kwargs=env_kwargs, agent=agent,
        )  # fmt: skip
        checkpoint = resolve_policy(policy)
        version = weight_version(checkpoint)
    except (ValueError, FileNotFoundError) as exc:
        fail(str(exc))

    async def main():
        runner = _policy_agent(
            policy,
            engine,
            device,
            engine_args,
            max_tokens,
            temp,
            "limit",
            top_p=top_p,
            tool_parser=tool_parser,
        )
        # generations carry the checkpoint's weight version, as on a rollout node holding it
        runner.engine.version = version
        progress = Progress(
            TextColumn(f"[bold]{name}:{split}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("passed {task.fields[passed]}"), TimeElapsedColumn(), console=console,
        )  # fmt: skip
        bar: list[int] = []
        passed = [0]

        def on_start(n: int) -> None:
            bar.append(progress.add_task("eval", total=n, passed=0))

        def on_result(row: dict) -> None:
            passed[0] += int(row["success"])
            progress.update(bar[0], advance=1, passed=passed[0])

        try:
            with progress:
                return await evaluate_task_set(runner, config, on_start, on_result)
        finally:
            await runner.close()

    try:
        report = asyncio.run(main())
    except (KeyError, ValueError, RuntimeError, OSError, ImportError, TypeError) as exc:
        fail(f"{type(exc).__name__}: {str(exc).strip(chr(34) + chr(39))}")
    report["meta"].update(
        policy=policy,
        checkpoint=checkpoint,
        weight_version=version,
        engine={"name": engine, "device": device, "args": engine_args},
        sampling={
            "temperature": temp,
            "top_p": top_p,
            "max_tokens": max_tokens,
            "samples": samples,
        },
    )
    console.print(render_summary(report))
    target = out or default_report_path(policy, name, split)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(report, indent=2, default=str) + "\n")
    console.print(f"report written to {target}")
    rows = report["samples"]
    if rows and all("error" in r for r in rows):  # nothing was evaluated: the work failed
        fail(f"every one of the {len(rows)} samples failed; the first: {rows[0]['error']}")


def weight_version(checkpoint: str) -> int:
    """The trainer's weight version of a checkpoint (its step marker); 0 for an initial model."""
    from astraflow.trainer.checkpoints import read_mark

    mark = read_mark(checkpoint) if Path(checkpoint).is_dir() else None
    return mark.version if mark is not None else 0


def default_report_path(policy: str, name: str, split: str) -> Path:
    path = Path(policy)
    if not policy.startswith("builtin:") and path.is_dir() and not (path / "config.json").exists():
        return path / "eval" / f"{name}-{split}.json"
    return Path(f"eval-{name}-{split}.json")


def render_summary(report: dict):
    from rich.table import Table

    from astraflow.launch.text import safe_text

    s, m = report["summary"], report["meta"]
    where = safe_text(f"{m['task_set']}:{m['split']} on {m['env']}")
    t = Table(title=f"{where} (weights v{m['weight_version']})")
    t.add_column("metric")
    t.add_column("value", justify="right")
    t.add_row("tasks", str(s["tasks"]))
    t.add_row("samples", str(s["samples"]))
    t.add_row("accuracy", f"{s['accuracy']:.1%}")
    for k, v in s["pass_at_k"].items():
        t.add_row(f"pass@{k}", f"{v:.1%}")
    for key, label in (("mean_reward", "mean reward"), ("mean_turns", "mean turns"),
                       ("mean_tokens", "mean tokens")):  # fmt: skip
        t.add_row(label, "-" if s[key] is None else f"{s[key]:.2f}")
    t.add_row("errors", str(s["errors"]))
    return t


@app.command()
def agentbench(
    policy: str = typer.Option(
        "builtin:tiny-arith",
        "--policy",
        help="builtin:NAME, a Hugging Face id or local path, or a run directory (latest checkpoint)",
    ),
    engine: str = typer.Option("transformers", "--engine", help=" | ".join(ENGINE_KINDS)),
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

    from astraflow.envs.agentbench import data as ab_data
    from astraflow.envs.agentbench.report import write_report
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from astraflow.rollout.evaluation.agentbench import (
        FAMILIES,
        EvalConfig,
        evaluate,
        oracle_agent,
    )

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
    *,
    top_p: float = 1.0,
    tool_parser: str = "auto",
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
        top_p=top_p,
        tool_parser=tool_parser,
    )


def render_tables(report: dict) -> list:
    """rich tables: one per family (summary, per-type accuracy for dbbench and alfworld, status
    histogram)."""
    from rich.table import Table

    from astraflow.launch.text import safe_text

    tables = []
    for family, fam in report["tasks"].items():
        # type and status names come from the tasks' data and the env: escaped, cleaned
        t = Table(
            title=safe_text(
                f"AgentBench {family} ({report['meta'].get('split')}, agent "
                f"{report['meta'].get('agent')})"
            ),
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
            t.add_row(f"  {safe_text(typ, 80)}", f"{slot['passed']}/{slot['total']} ({acc:.0%})")
        for status, count in sorted(fam["status"].items()):
            t.add_row(f"status: {safe_text(status, 80)}", str(count))
        tables.append(t)
    return tables


def _make_engine(engine: str, model_path: str, device: str, engine_args: dict):
    """An engine from ``astraflow.rollout.engines.make_engine`` (the rollout nodes' factory)."""
    from astraflow.rollout.engines import make_engine

    kwargs = dict(engine_args)
    if engine == "transformers":
        kwargs.setdefault("device", device)
    # a hub id resolves in the local HF cache there (ModelNotCached, a FileNotFoundError, says
    # what to do when it is not)
    return make_engine(engine, model_path, **kwargs)


def parse_engine_args(items: list[str], flag: str = "--engine-arg") -> dict:
    """``KEY=VALUE`` pairs; VALUE is read as JSON when it parses (numbers, true, lists), else text."""
    import json

    out: dict = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"{flag} expects KEY=VALUE, got {item!r}")
        try:
            out[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            out[key.strip()] = value
    return out


def resolve_policy(policy: str) -> str:
    """builtin:NAME -> its path; a run directory -> its latest checkpoint; anything else as is
    (:func:`astraflow.models.loading.resolve_checkpoint`, shared with `serve policy`)."""
    from astraflow.models.loading import resolve_checkpoint

    return resolve_checkpoint(policy)
