"""AgentBench recipes: they validate, their task sets load, and one group of the CPU recipe's
episodes runs through the real rollout workflow (tiny policy, transformers engine, real envs) and
yields token-in/token-out trajectories a trainer can consume."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from agentbench_helpers import need_alfworld, need_alfworld_data, need_data

from astraflow.recipe import load_recipe

RECIPES = Path(__file__).resolve().parents[2] / "recipes"
ALL = [
    "agentbench_os.toml",
    "agentbench_db.toml",
    "gpu/agentbench_os.toml",
    "gpu/agentbench_db.toml",
    "agentbench_alfworld.toml",
    "gpu/agentbench_alfworld.toml",
]
CPU = ["agentbench_db.toml", "agentbench_os.toml", "agentbench_alfworld.toml"]


def need_env_backend(recipe) -> None:
    """Skip when the recipe's env cannot run here (no OS sandbox, no alfworld extra)."""
    if recipe.tasks.env.endswith("OS-v0"):
        from astraflow.envs.agentbench.os.sandbox import SandboxError, select_sandbox

        try:
            select_sandbox("auto")
        except SandboxError as exc:
            pytest.skip(str(exc))
    if recipe.tasks.env.endswith("ALFWorld-v0"):
        need_alfworld_data()
        need_alfworld()


@pytest.mark.parametrize("name", ALL)
def test_recipe_validates_and_its_task_set_loads(name, monkeypatch):
    data = need_data()
    monkeypatch.setenv("ASTRAFLOW_AGENTBENCH_DATA", str(data))
    from astraflow.tasks.catalog import load_task_set

    recipe = load_recipe(RECIPES / name)
    if recipe.tasks.env.endswith("ALFWorld-v0"):
        need_alfworld_data()
    assert recipe.tasks.env in (
        "astraflow/AgentBench-OS-v0",
        "astraflow/AgentBench-DB-v0",
        "astraflow/AgentBench-ALFWorld-v0",
    )
    for s in recipe.tasks.sets:
        items = load_task_set(s.name, s.split, seed=recipe.run.seed, **s.kwargs)
        assert items and all("id" in p for p in items)


@pytest.mark.parametrize(
    "name",
    # ALFWorld's group loads TextWorld games: in the full suite only
    [pytest.param(n, marks=pytest.mark.slow) if "alfworld" in n else n for n in CPU],
)
def test_cpu_recipe_rollout_group_with_tiny_policy(name, monkeypatch):
    data = need_data()
    monkeypatch.setenv("ASTRAFLOW_AGENTBENCH_DATA", str(data))
    from astraflow.envs.registry import make_env
    from astraflow.tasks.catalog import load_task_set

    from astraflow.models import resolve_model
    from astraflow.protocol import Task
    from astraflow.rollout.engines.base import SamplingParams
    from astraflow.rollout.engines.transformers_engine import TransformersEngine
    from astraflow.rollout.env_runner import EnvRunner
    from astraflow.rollout.workflows import RolePolicy
    from astraflow.rollout.workflows.single_agent import single_agent

    recipe = load_recipe(RECIPES / name)
    need_env_backend(recipe)
    s = recipe.tasks.sets[0]
    payload = load_task_set(s.name, s.split, seed=0, **s.kwargs)[0]
    pol = recipe.policies["policy"]
    engine = TransformersEngine(resolve_model(pol.model), device="cpu", seed=0)
    sampling = SamplingParams(
        temperature=pol.sampling.temperature, max_tokens=pol.sampling.max_tokens
    )
    task = Task(env=recipe.tasks.env, payload=payload, group_size=2)
    role = RolePolicy("policy", engine, sampling)
    runner = EnvRunner(lambda env_id, kw: make_env(env_id, **kw), workers=2)

    async def group():
        try:
            return await asyncio.gather(
                *(
                    single_agent(
                        task,
                        {"agent": role},
                        runner.make,
                        max_turns=recipe.workflow.max_turns,
                        **recipe.workflow.kwargs,
                        **recipe.tasks.env_kwargs,
                    )
                    for _ in range(task.group_size)
                )
            )
        finally:
            runner.shutdown()
            await engine.close()

    episodes = asyncio.run(group())
    for ep in episodes:
        (traj,) = ep.trajectories
        assert len(traj.tokens) == len(traj.loss_mask) == len(traj.logprobs)
        assert sum(traj.loss_mask) > 0  # the policy generated tokens that a trainer would learn
        assert (
            len(traj.tokens) <= recipe.workflow.kwargs["max_total_tokens"] + pol.sampling.max_tokens
        )
        assert ep.rewards["agent"] in (0.0, 1.0)


@pytest.fixture(scope="module")
def db_run(tmp_path_factory):
    """`astraflow train` on the CPU DB recipe (its 3 optimizer steps). One recipe trains: the three
    CPU recipes share the trainer side, and each one's rollouts run through the real workflow, envs
    and engine in test_cpu_recipe_rollout_group_with_tiny_policy above."""
    import json
    import os
    import subprocess
    import sys

    data = need_data()
    name = "agentbench_db.toml"
    recipe = load_recipe(RECIPES / name)
    need_env_backend(recipe)
    tmp_path = tmp_path_factory.mktemp("agentbench-db")
    env = {**os.environ, "ASTRAFLOW_AGENTBENCH_DATA": str(data)}
    cmd = [sys.executable, "-m", "astraflow.cli.main", "train", str(RECIPES / name), "--no-live",
           "--timeout", "400", "--set", f"run.output_dir={tmp_path}"]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=500, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    run_dir = tmp_path / recipe.run.name
    steps = [
        json.loads(line)
        for line in (run_dir / "metrics.jsonl").read_text().splitlines()
        if '"type": "step"' in line
    ]
    return run_dir, steps, data


@pytest.mark.slow
def test_cpu_recipe_trains_end_to_end(db_run):
    """Every service starts, rollouts run in the real envs and the trainer commits its 3 steps."""
    run_dir, steps, _data = db_run
    assert [s["step"] for s in steps] == [1, 2, 3]
    assert all(s["samples"] > 0 for s in steps)
    from astraflow.cli.eval import resolve_policy

    assert Path(resolve_policy(str(run_dir))).name.startswith("checkpoint-")


@pytest.mark.slow
def test_the_trained_checkpoint_serves_eval_agentbench_end_to_end(db_run, tmp_path):
    """`astraflow eval agentbench` with a real tiny policy (the run's checkpoint of tiny-arith),
    on dbbench and, where an OS sandbox runs, os (was tests/envs/test_agentbench_eval.py's
    test_tiny_policy_end_to_end on builtin:tiny-arith)."""
    import json
    import subprocess
    import sys

    from astraflow.envs.agentbench.os.sandbox import docker_available, overlay_problem

    run_dir, _steps, data = db_run
    families = ["dbbench"]
    if docker_available() or overlay_problem() is None:
        families.append("os")
    out = tmp_path / "results.json"
    # the tiny model has a 256-token context, so the prompt is cut to the latest tokens
    cmd = [sys.executable, "-m", "astraflow.cli.main", "eval", "agentbench",
           "--policy", str(run_dir), "--tasks", ",".join(families), "--limit", "2",
           "--data", str(data), "--device", "cpu", "--max-tokens", "16",
           "--overflow", "truncate", "--concurrency", "2", "--out", str(out)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert all(f"AgentBench {family}" in proc.stdout for family in families)
    report = json.loads(out.read_text())
    assert report["meta"]["policy"] == str(run_dir)
    for family in families:
        fam = report["tasks"][family]
        assert fam["total"] == 2 and fam["skipped"] == 0
        assert 0.0 <= fam["success_rate"] <= 1.0 and sum(fam["status"].values()) == 2
        for sample in report["samples"][family]:
            assert sample["replies"] and sample["turns"] >= 1  # the model really generated
            assert sample["status"] != "task error", sample
    assert set(report["tasks"]["dbbench"]["by_type"]) <= {"other", "comparison", "counting"}
