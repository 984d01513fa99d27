"""`astraflow envs list|show|check`: every registered environment, built in or from a plugin."""

from __future__ import annotations

import inspect
import json
import math
import time
import traceback
import warnings
from typing import Any

import typer
from astraflow.cli.common import console, err_console, fail
from rich.markup import escape
from rich.table import Table

app = typer.Typer(help="Environments: built-in and plugins.", no_args_is_help=True)


def _registry():
    from astraflow.envs.registry import default_registry

    reg = default_registry()
    for name, error in sorted(reg.errors.items()):
        err_console.print(
            f"[yellow]warning:[/] env plugin {escape(name)!s} failed to load: {escape(error)}",
            highlight=False,
        )
    return reg


def _spec_or_exit(reg, env_id: str):
    from astraflow.envs.registry import UnknownEnvError

    try:
        return reg.get(env_id)
    except UnknownEnvError as exc:
        fail(escape(str(exc)))


def _parse_kwargs(pairs: list[str]) -> dict[str, Any]:
    """``key=value`` pairs; values are JSON when they parse as JSON, strings otherwise."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            fail(f"--kwarg expects key=value, got {pair!r}")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


@app.command("list")
def list_(
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table"),
) -> None:
    """Table of every registered environment (id, family, source package, description)."""
    specs = _registry().specs()
    if as_json:
        rows = [
            {"id": s.id, "family": s.family, "source": s.source, "description": s.description,
             "entry_point": s.entry_point}
            for s in specs
        ]  # fmt: skip
        print(json.dumps(rows, indent=2))
        return
    table = Table(title=f"{len(specs)} environments")
    for column in ("id", "family", "source", "description"):
        table.add_column(column, overflow="fold")
    for s in specs:
        table.add_row(escape(s.id), s.family, escape(s.source), escape(s.description))
    console.print(table)


@app.command()
def show(env_id: str = typer.Argument(..., help="Env id, e.g. astraflow/Math-v0")) -> None:
    """Action format, reward, task fields and constructor kwargs of one environment."""
    reg = _registry()
    spec = _spec_or_exit(reg, env_id)
    try:
        cls = spec.load_class()
    except ImportError as exc:
        fail(escape(str(exc)))
    console.print(f"[bold]{escape(spec.id)}[/]  ({spec.family}, from {escape(spec.source)})")
    console.print(escape(getattr(cls, "description", "") or spec.description), highlight=False)
    console.print(f"[dim]entry point:[/] {escape(spec.entry_point)}", highlight=False)
    console.print("\n[bold]Action format[/]")
    console.print(escape(getattr(cls, "action_format", "") or "(not documented)"), highlight=False)
    console.print("\n[bold]Reward[/]")
    console.print(escape(getattr(cls, "reward_doc", "") or "(not documented)"), highlight=False)
    fields = Table(title="Task fields (payload of reset(options={'task': ...}))")
    fields.add_column("field")
    fields.add_column("description", overflow="fold")
    for name, doc in (getattr(cls, "task_fields", {}) or {}).items():
        fields.add_row(escape(name), escape(doc))
    console.print(fields)
    kwargs = Table(title="Constructor kwargs (recipe: tasks.env_kwargs)")
    kwargs.add_column("kwarg")
    kwargs.add_column("default", overflow="fold")
    for name, param in inspect.signature(cls).parameters.items():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        default = spec.kwargs.get(name, param.default)
        shown = "(required)" if default is inspect.Parameter.empty else repr(default)
        kwargs.add_row(escape(name), escape(shown))
    console.print(kwargs)


def _random_episodes(env, episodes: int, seed: int, max_action_chars: int) -> dict[str, Any]:
    """Episodes on the env's sample tasks with random text actions; checks every return value."""
    rewards, steps = [], []
    for ep in range(episodes):
        obs, info = env.reset(seed=seed + ep)
        assert env.observation_space.contains(obs), "reset observation not in observation_space"
        assert isinstance(info, dict), "reset info is not a dict"
        if "messages" in info:
            _check_messages(info["messages"], "reset")
        env.action_space.seed(seed + ep)
        total, n, done = 0.0, 0, False
        while not done:
            length = int(env.np_random.integers(0, max_action_chars + 1))
            obs, reward, terminated, truncated, info = env.step(
                env.action_space.sample(mask=(length, None))
            )
            n += 1
            assert env.observation_space.contains(obs), (
                f"step {n}: observation not in observation_space"
            )
            assert isinstance(reward, float) and math.isfinite(reward), (
                f"step {n}: reward {reward!r}"
            )
            assert isinstance(info, dict), f"step {n}: info is not a dict"
            _check_info(info, reward, terminated, truncated, f"step {n}")
            total += reward
            done = terminated or truncated
            if n > 10_000:
                raise AssertionError("episode did not end within 10000 random steps")
        assert isinstance(info.get("success"), bool), (
            f"final info's 'success' must be a bool, got {info.get('success')!r}"
        )
        rewards.append(total)
        steps.append(n)
    return {"mean_reward": sum(rewards) / len(rewards), "mean_steps": sum(steps) / len(steps)}


def _check_messages(messages: Any, where: str) -> None:
    """``info["messages"]``: chat turns a workflow renders (any role incl. ``tool``)."""
    from astraflow.rollout.workflows.tokens import check_turn_messages

    try:
        check_turn_messages(messages)
    except ValueError as exc:
        raise AssertionError(f"{where}: info['messages']: {exc}") from None


def _check_info(info: dict, reward: float, terminated: bool, truncated: bool, where: str) -> None:
    """The step ``info`` keys that mean something (docs/environments.md) hold what they mean."""
    assert isinstance(terminated, bool) and isinstance(truncated, bool), (
        f"{where}: terminated/truncated must be bools"
    )
    assert not (terminated and truncated), f"{where}: terminated and truncated both set"
    if "messages" in info:
        _check_messages(info["messages"], where)
    if "reward" in info:
        assert info["reward"] == reward, (
            f"{where}: info['reward'] {info['reward']!r} is not the returned reward {reward!r}"
        )
    if "success" in info:
        assert isinstance(info["success"], bool), f"{where}: info['success'] must be a bool"


def check_one(env_id: str, kwargs: dict[str, Any], episodes: int, seed: int,
              max_action_chars: int) -> dict[str, Any]:  # fmt: skip
    """check_env plus random episodes; returns a result row (``ok``, ``error``, stats)."""
    import gymnasium as gym
    from astraflow.envs.registry import default_registry
    from gymnasium.utils.env_checker import check_env

    row: dict[str, Any] = {"id": env_id, "ok": False, "error": "", "warnings": []}
    t0 = time.perf_counter()
    try:
        if env_id in gym.registry:
            env = gym.make(env_id, **kwargs).unwrapped
        else:  # a family id (skyrl:ID) is no Gymnasium id: Gymnasium reads "module:id" from it
            env = default_registry().make(env_id, **kwargs)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            check_env(env)
        # Gymnasium's checker reports through warnings ("WARN: ..."); other libraries' deprecation
        # noise raised while the env runs is not the env's fault and is left out.
        row["warnings"] = sorted(
            {str(w.message).strip() for w in caught if "WARN:" in str(w.message)}
        )
        row.update(_random_episodes(env, episodes, seed, max_action_chars))
        env.close()
        row["ok"] = True
    except Exception as exc:  # reported, not raised: the command checks every env it is given
        row["error"] = f"{type(exc).__name__}: {exc}"
        row["traceback"] = traceback.format_exc()
    row["seconds"] = time.perf_counter() - t0
    return row


@app.command()
def check(
    env_ids: list[str] = typer.Argument(None, help="Env ids to check (default: all registered)"),
    episodes: int = typer.Option(3, min=1, help="Random episodes per env after check_env"),
    seed: int = typer.Option(0, help="Seed of the first episode"),
    max_action_chars: int = typer.Option(200, min=0, help="Longest random action"),
    kwarg: list[str] = typer.Option([], "--kwarg", help="Env kwarg key=value (JSON value)"),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Show tracebacks"),
) -> None:
    """Run Gymnasium's check_env and random episodes on sample tasks; exit 1 on any failure."""
    reg = _registry()
    ids = env_ids or [s.id for s in reg.specs()]
    for env_id in ids:
        _spec_or_exit(reg, env_id)
    kwargs = _parse_kwargs(kwarg)
    table = Table(title="Environment checks")
    for column in ("id", "result", "episodes", "mean reward", "mean steps", "seconds"):
        table.add_column(column, overflow="fold")
    failed = []
    with console.status("checking environments") as status:
        for env_id in ids:
            status.update(f"checking {env_id}")
            row = check_one(env_id, kwargs, episodes, seed, max_action_chars)
            if row["ok"]:
                result = "[green]ok[/]"
                if row["warnings"]:
                    result += f" [yellow]({len(row['warnings'])} warnings)[/]"
                stats = (str(episodes), f"{row['mean_reward']:.3f}", f"{row['mean_steps']:.1f}")
            else:
                failed.append(row)
                result = f"[red]FAIL[/] {escape(row['error'])}"
                stats = ("-", "-", "-")
            table.add_row(escape(env_id), result, *stats, f"{row['seconds']:.2f}")
    console.print(table)
    for row in failed:
        err_console.print(f"[red]{escape(row['id'])}:[/] {escape(row['error'])}", highlight=False)
        if verbose:
            err_console.print(escape(row.get("traceback", "")), highlight=False)
    if failed:
        fail(
            f"{len(failed)} of {len(ids)} environment(s) failed: {', '.join(r['id'] for r in failed)}"
        )


@app.command("build-sandbox-image")
def build_sandbox_image(
    force: bool = typer.Option(False, "--force", help="Rebuild even if present"),
) -> None:
    """Build the code sandbox's Docker image locally (debootstrap + docker import; no registry)."""
    from astraflow.cli.sandbox import build_image_cmd

    build_image_cmd(force=force, mirror="http://deb.debian.org/debian", tag=None)
