"""`astraflow transcripts RUN_DIR|URL`: what the policy wrote, episode by episode.

Reads the few finished episodes per step that the dataflow keeps (``logging.transcripts_per_step``):
from a run directory's store (finished or live) or from a live service's ``GET /transcripts``.
Each turn is printed by role, context apart from what the policy generated, with the reward,
finish reason, weight versions and the error of a failed episode, and what became of each
sample: trained in which step, or why not (filtered, dropped, failed, still buffered), so an
episode the trainer never saw is never read as one it learned from. ``--trained`` keeps those it
learned from.
"""

from __future__ import annotations

from pathlib import Path

import typer
from astraflow.cli.common import console, fail

#: the most transcripts one request returns (the service's bound on ``limit``)
MAX_FETCH = 500


def transcripts(
    source: str = typer.Argument(..., help="Run directory, or a dataflow URL (with --token)"),
    step: int | None = typer.Option(None, "--step", help="Only episodes of this weight version"),
    failed: bool = typer.Option(False, "--failed", help="Only failed episodes"),
    trained: bool = typer.Option(
        False,
        "--trained",
        help="Only episodes whose samples were trained (in an acknowledged step)",
    ),
    limit: int = typer.Option(10, "--limit", min=1, max=500, help="Episodes to show"),
    token: str = typer.Option(
        None, "--token", envvar="ASTRAFLOW_TOKEN", help="Run secret (admin token), for a URL"
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON (records with decoded turns)"),
) -> None:
    """Print the sampled transcripts of a run: turns by role, reward, finish reason, versions."""
    from astraflow.launch.transcripts import Decoders, load_recipe_of, read_store

    if trained and failed:
        fail("--trained and --failed exclude each other: a failed episode yields no sample")
    only_failed = True if failed else None
    # --trained filters after reading: read the most a request may return, keep `limit`
    fetch = MAX_FETCH if trained else limit
    recipe = None
    try:
        if source.startswith(("http://", "https://")):
            from astraflow.protocol.client import DataflowClientError, SyncDataflowClient

            if not token:
                fail("a URL needs --token (the run secret, in RUN_DIR/run.secret)")
            try:
                with SyncDataflowClient(source, token, timeout=10.0, retries=1) as client:
                    records = client.transcripts(step, only_failed, fetch).transcripts
                    recipe = client.recipe()
            except DataflowClientError as exc:
                fail(str(exc))
        else:
            run_dir = Path(source)
            records = read_store(run_dir, step, only_failed, fetch)
            recipe = load_recipe_of(run_dir)
    except FileNotFoundError as exc:
        fail(str(exc))
    if trained:
        records = [r for r in records if r.trained][:limit]
    decoders = Decoders(recipe)
    shown = [decoders.decode(r) for r in records]
    if as_json:
        import json

        print(json.dumps([t.model_dump() for t in shown], indent=2))
        return
    if not shown:
        what = "failed episodes" if failed else "trained episodes" if trained else "transcripts"
        at = f" at step {step}" if step is not None else ""
        console.print(f"no {what}{at} kept (logging.transcripts_per_step sets how many per step)")
        return
    for t in shown:
        print_transcript(t)


def print_transcript(t) -> None:
    from rich.panel import Panel
    from rich.text import Text

    from astraflow.launch.text import safe_text
    from astraflow.protocol.transcripts import FATES

    # Everything here is what a rollout node sent (ids, roles, the policy's and the env's text,
    # the error): Text objects (never parsed as markup) of text cleaned of control characters.
    def plain(value, limit: int | None = 200, multiline: bool = False) -> str:
        return safe_text(value, limit, markup=False, multiline=multiline)

    r = t.record
    rewards = ", ".join(f"{plain(role, 60)} {v:.3f}" for role, v in r.rewards.items()) or "-"
    adv = ", ".join(f"{plain(role, 60)} {v:+.3f}" for role, v in r.advantages.items())
    title = f"step {r.step} · {plain(r.episode_id)}"
    body = Text()
    body.append(
        f"task {plain(r.task_id)} · {plain(r.finish_reason, 60)} · reward {rewards}", style="bold"
    )
    body.append((f" · advantage {adv}" if adv else "") + "\n", style="bold")
    for turn in t.turns:
        role = plain(turn.role, 60)
        who = role if turn.source == "policy" else f"{role} (context)"
        versions = f" v{','.join(map(str, turn.versions))}" if turn.versions else ""
        style = "bold green" if turn.source == "policy" else "cyan"
        body.append(f"{who}{versions} · {turn.tokens} tokens\n", style=style)
        body.append(plain(turn.text, None, multiline=True).rstrip() + "\n")
    for role, fate in r.fates.items():
        what = FATES.get(fate, fate)
        if fate == "trained":
            what = f"trained in step {r.trained_steps.get(role)}"
        label = f"{plain(role, 60)}: " if len(r.fates) > 1 else ""
        body.append(f"{label}{what}\n", style="green" if fate == "trained" else "yellow")
    if r.error:
        body.append(f"error: {plain(r.error, 4000, multiline=True)}\n", style="red")
    policies = ", ".join(f"{plain(role, 60)}→{plain(p, 80)}" for role, p in r.policy.items())
    # Text, not markup: task ids hold ':' pairs that rich would read as emoji codes (':train:')
    console.print(
        Panel(body, title=Text(title), subtitle=Text(policies), title_align="left"),
        highlight=False,
        emoji=False,
    )
