"""Two policies trained together in ONE run, as two LoRA adapters of one base, in the agentic
set-up: ``recipes/multi_policy_lora.toml`` (solver + verifier adapters of ``builtin:tiny-arith``,
one engine on the node, one trainer process) with the tools of
``recipes/multi_policy_agentic.toml`` (the solver's tries in ``astraflow/MathMultiTurn-v0`` and
the verifier's check tool ``astraflow/Math-v0``, both behind the long-tailed latency wrapper).

One run proves what three did (tests/e2e/test_multi_policy.py, test_multi_lora.py and
test_train_multi_policy_agentic.py): both version streams advance on their own and drift apart,
each trainer is served only its own role's samples, the node updates both policies, episodes go
through both tools, each adapter's weights move while the base stays byte-identical."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from astraflow.dataflow.storage import history, store

# a whole two-policy training run: slow tier
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
STEPS = 6
LATENCY = (
    '{ distribution = "lognormal", p50_s = 0.03, p99_s = 0.5, on = ["step"], inner = "inline" }'
)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    pytest.importorskip("peft")
    out = tmp_path_factory.mktemp("runs")
    sets = [
        f"run.max_steps={STEPS}",
        "tasks.group_size=4",
        "rollout.concurrency=16",
        "evaluation.every_steps=0",
        "evaluation.at_start=false",
        # the verifier's trainer does twice the work per step: the two streams drift apart
        # unless something holds them in lock-step
        "policies.solver.trainer.groups_per_step=2",
        "policies.verifier.trainer.groups_per_step=4",
        # the agentic set-up of recipes/multi_policy_agentic.toml: up to 3 tries in a multi-turn
        # env, the verdict checked by a tool, both behind the latency wrapper (ten times shorter)
        'tasks.env="astraflow/MathMultiTurn-v0"',
        f"tasks.env_latency={LATENCY}",
        "workflow.max_turns=3",
        'workflow.kwargs.verifier_tool_env="astraflow/Math-v0"',
        "dataflow.buffer_steps=4",
        # the starter model writes a digit after "a+b=c?", "7" most often and "0" almost never: with
        # "7" as the verdict "wrong" the verifier is rewarded (hence moves) within six steps
        'workflow.kwargs.reject="7"',
        f"run.output_dir={json.dumps(str(out))}",
    ]
    argv = [
        sys.executable,
        "-m",
        "astraflow.cli.main",
        "train",
        "recipes/multi_policy_lora.toml",
        "--no-live",
    ]
    for s in sets:
        argv += ["--set", s]
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "COLUMNS": "200"})  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out / "multi-policy-lora"


def _steps(run_dir: Path) -> list[dict]:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in records if r["type"] == "step"]


def test_both_version_streams_advance_on_their_own(run_dir):
    steps = _steps(run_dir)
    for policy in ("solver", "verifier"):
        assert [r["version"] for r in steps if r["policy"] == policy] == list(range(1, STEPS + 1))
    with store.read_only(run_dir / "dataflow.db") as tx:
        published = history.versions(tx)  # in announcement order
    assert {v.policy for v in published} == {"solver", "verifier"}
    # replay the announcements: the two policies' versions diverge at some point (no lock-step)
    current = {"solver": 0, "verifier": 0}
    gaps = []
    for v in published:
        current[v.policy] = v.version
        gaps.append(abs(current["solver"] - current["verifier"]))
    assert max(gaps) >= 2, published


def test_each_trainer_gets_only_its_own_role(run_dir):
    with store.read_only(run_dir / "dataflow.db") as tx:
        samples, batches = history.samples(tx), history.batches(tx)
    # the dataflow split each episode by role: each policy trained on its own role only
    roles: dict[str, set[str]] = {}
    for sample in samples:
        roles.setdefault(sample.policy, set()).add(sample.role)
    assert roles == {"solver": {"solver"}, "verifier": {"verifier"}}
    # every batch a trainer was served holds only that trainer's policy's samples
    policy_of = {b.id: b.policy for b in batches}
    mixed = [s.id for s in samples if s.batch_id and s.policy != policy_of[s.batch_id]]
    assert mixed == []


def test_nodes_updated_both_policies_with_adapter_deltas(run_dir):
    node = (run_dir / "logs" / "node-0.log").read_text()
    assert "policy solver: v" in node and "policy verifier: v" in node
    for policy in ("solver", "verifier"):
        assert re.search(rf"policy {policy}: v\d+ -> v\d+ \(delta\)", node), policy


def test_episodes_go_through_both_tools(run_dir):
    with store.read_only(run_dir / "dataflow.db") as tx:
        episodes = [e for e in history.episodes(tx) if not e.is_eval and not e.error]
    assert episodes
    turns = [e.info["metrics"]["turns"] for e in episodes]
    assert max(turns) > 1 and all(1 <= t <= 3 for t in turns)  # wrong answers got another try
    for e in episodes:
        info = e.info["info"]
        # the verifier's reward is its check tool's grade of the verdict: right or wrong
        right = info["verdict"] is not None and info["verdict"] == info["correct"]
        assert e.rewards == {"solver": float(info["correct"]), "verifier": float(right)}
        assert e.info["metrics"]["env_s"] > 0  # every episode waited on its tools


def test_one_engine_and_one_trainer_process_serve_both_adapters(run_dir):
    pids = json.loads((run_dir / "pids.json").read_text())
    assert sorted(pids) == ["dataflow", "node-0", "trainer-solver+verifier"]
    node = (run_dir / "logs" / "node-0.log").read_text()
    assert "one transformers engine for base builtin:tiny-arith serves solver, verifier" in node


def test_each_adapter_s_weights_move_and_versions_hold_the_adapter_only(run_dir):
    from safetensors.torch import load_file

    weights = run_dir / "weights"
    states = {}
    for policy in ("solver", "verifier"):
        kept = sorted(int(p.name[1:]) for p in (weights / policy).glob("v*"))
        assert kept[-1] == STEPS
        states[policy] = [load_file(weights / policy / f"v{v}" / "model.safetensors") for v in kept]
        for state in states[policy]:
            assert state and all(".lora_A." in k or ".lora_B." in k for k in state)
        # (a step whose every group had one reward for all has no gradient and moves nothing)
        first, last = states[policy][0], states[policy][-1]
        assert any(not torch.equal(first[k], last[k]) for k in first), policy
    # two different adapters (own seeds, own training), on the same modules of the same base
    solver, verifier = states["solver"][-1], states["verifier"][-1]
    assert set(solver) == set(verifier)
    assert all(not torch.equal(solver[k], verifier[k]) for k in solver)


def test_the_base_stays_byte_identical(run_dir):
    trainer = (run_dir / "logs" / "trainer-solver+verifier.log").read_text()
    assert "base builtin:tiny-arith unchanged after training" in trainer
    assert "changed during training" not in trainer
