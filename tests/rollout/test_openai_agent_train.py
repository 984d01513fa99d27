"""`astraflow train` with ``workflow.name = "openai_agent"``: the built-in policy trains on
arithmetic through an agent written only with the ``openai`` SDK (no AstraFlow import)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from astraflow.dataflow.storage import history, store

pytest.importorskip("openai", reason="the openai SDK is in the test extra")

ROOT = Path(__file__).resolve().parents[2]
AGENT = Path(__file__).resolve().parent / "openai_agents" / "arith_agent.py"


@pytest.mark.slow
def test_an_openai_sdk_agent_trains_the_builtin_policy(tmp_path):
    sets = [
        "workflow.name=openai_agent",
        f"workflow.agent={json.dumps(f'{AGENT}:solve')}",
        "run.max_steps=3",
        "tasks.group_size=4",
        "policies.policy.trainer.groups_per_step=2",
        "rollout.concurrency=16",
        "evaluation.every_steps=3",
        "evaluation.num_tasks=16",
        f"run.output_dir={json.dumps(str(tmp_path))}",
    ]
    argv = [
        sys.executable,
        "-m",
        "astraflow.cli.main",
        "train",
        "recipes/quickstart.toml",
        "--no-live",
    ]
    for s in sets:
        argv += ["--set", s]
    proc = subprocess.run(
        argv, cwd=ROOT, capture_output=True, text=True, timeout=600,
        env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    run_dir = tmp_path / "quickstart"
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x]
    steps = [r for r in records if r.get("type") == "step"]
    assert [r["version"] for r in steps] == [1, 2, 3]
    evals = [r for r in records if r.get("type") == "eval"]
    assert evals, "the held-out evaluation ran through the agent too"
    with store.read_only(run_dir / "dataflow.db") as tx:
        episodes, samples = history.episodes(tx), history.samples(tx)
    # every episode came through the agent's SDK call, and the trained samples carry its tokens
    assert episodes and all(e.info["metrics"].get("calls") == 1.0 for e in episodes)
    samples = [r for r in samples if r.policy == "policy"]
    assert samples and sum(r.n_tokens for r in samples) > 0


@pytest.mark.slow
def test_per_call_rewards_train_with_turn_discount(tmp_path):
    """An AReaL-style agent reports a reward per call (client.set_reward); the samples keep them
    per turn and the trainer credits each turn with its discounted return."""
    import sys as _sys

    _sys.path.insert(0, str(ROOT / "tests" / "tools"))
    from quickstart_run import TWO_SMALL_STEPS, train_quickstart

    run = train_quickstart(
        tmp_path,
        [
            "workflow.name=openai_agent",
            f"workflow.agent={json.dumps(f'{AGENT}:rewarded_turns')}",
            "policies.policy.trainer.turn_discount=0.9",
            # every episode's total is the same (0.25 + 0.5 + 1.0): only the turns differ
            'dataflow.policies=[{ name = "staleness", kwargs = { max_staleness = 2 } }]',
            *TWO_SMALL_STEPS,
        ],
    )
    assert run.step_versions == [1, 2]
    kept = [json.loads(r.turn_rewards) for r in run.read(history.samples)]
    assert kept and all(k == [0.25, 1.5] for k in kept), kept[:3]
    # the trainer took steps on them: with one advantage per sample these groups carry none
    losses = [r["metrics"].get("loss") for r in run.records if r.get("type") == "step"]
    assert all(loss is not None and loss != 0.0 for loss in losses), run.records
