"""Two LoRA adapters of one base trained inside one multi-role episode (solve_verify): the solver
and the verifier of ``recipes/multi_policy_lora.toml`` are adapters of ``builtin:tiny-arith``,
served by one engine on the node and trained by one trainer process. Each adapter's versions and
weights move on their own; the base stays byte-identical."""

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


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    pytest.importorskip("peft")
    out = tmp_path_factory.mktemp("runs")
    sets = [
        f"run.max_steps={STEPS}",
        "tasks.group_size=4",
        "rollout.concurrency=16",
        "evaluation.every_steps=0",
        # the verifier's trainer does twice the work per step: the two streams drift apart
        # unless something holds them in lock-step
        "policies.solver.trainer.groups_per_step=2",
        "policies.verifier.trainer.groups_per_step=4",
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
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "COLUMNS": "200"})  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out / "multi-policy-lora"


def test_one_engine_and_one_trainer_process_serve_both_adapters(run_dir):
    pids = json.loads((run_dir / "pids.json").read_text())
    assert sorted(pids) == ["dataflow", "node-0", "trainer-solver+verifier"]
    node = (run_dir / "logs" / "node-0.log").read_text()
    assert "one transformers engine for base builtin:tiny-arith serves solver, verifier" in node


def test_each_adapter_has_its_own_version_stream(run_dir):
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if r["type"] == "step"]
    for policy in ("solver", "verifier"):
        assert [r["version"] for r in steps if r["policy"] == policy] == list(range(1, STEPS + 1))
    with store.read_only(run_dir / "dataflow.db") as tx:
        published = history.versions(tx)  # in announcement order
        samples = history.samples(tx)
    current = {"solver": 0, "verifier": 0}
    gaps = []
    for v in published:
        current[v.policy] = v.version
        gaps.append(abs(current["solver"] - current["verifier"]))
    assert max(gaps) >= 2, published  # the streams moved apart: nothing held them together
    # the dataflow split each episode by role: each adapter trained on its own role only
    roles: dict[str, set[str]] = {}
    for sample in samples:
        roles.setdefault(sample.policy, set()).add(sample.role)
    assert roles == {"solver": {"solver"}, "verifier": {"verifier"}}


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


def test_nodes_load_adapter_deltas_and_the_base_stays_byte_identical(run_dir):
    node = (run_dir / "logs" / "node-0.log").read_text()
    for policy in ("solver", "verifier"):
        assert re.search(rf"policy {policy}: v\d+ -> v\d+ \(delta\)", node), policy
    trainer = (run_dir / "logs" / "trainer-solver+verifier.log").read_text()
    assert "base builtin:tiny-arith unchanged after training" in trainer
    assert "changed during training" not in trainer
