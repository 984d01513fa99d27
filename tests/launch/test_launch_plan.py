"""The launch plan (astraflow.launch.plan): devices and environment of every process a recipe's
run starts, the memory estimate, the over-subscription refusal and ``train --dry-run``.

Nothing here needs a GPU or a downloaded model: device numbers are planned for whatever machine
the recipe names, and models are Qwen3-shaped configs written into temporary directories (a
local checkpoint directory, or a local Hugging Face cache), read without weights.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from astraflow.launch import plan as plan_mod
from astraflow.launch.local import LaunchError, LocalLauncher, RunHandle
from astraflow.launch.plan import (
    GIB,
    PlanError,
    build_plan,
    model_shape,
    trainer_memory,
)
from astraflow.launch.processes import Service, service_env
from astraflow.launch.ray_actor import RAY_GPUS, ServiceProcess
from astraflow.launch.security import RunSecurity
from astraflow.recipe import load_recipe

REPO = Path(__file__).resolve().parents[2]
MULTI = REPO / "recipes" / "gpu" / "multi_policy_math.toml"
#: Qwen3-0.6B's published parameter count (tied embeddings counted once)
QWEN3_06B_PARAMETERS = 596_049_920

_QWEN3 = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "attention_bias": False,
    "head_dim": 128,
    "hidden_act": "silu",
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "max_position_embeddings": 40960,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000,
    "tie_word_embeddings": True,
    "vocab_size": 151936,
    "torch_dtype": "bfloat16",
}
QWEN3_SIZES = {
    "Qwen/Qwen3-0.6B": {"hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28},
    "Qwen/Qwen3-1.7B": {"hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 28},
}


def qwen3_dir(root: Path, hub_id: str) -> Path:
    """A checkpoint directory holding only Qwen3's config (enough for the plan)."""
    d = root / hub_id.replace("/", "--")
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps({**_QWEN3, **QWEN3_SIZES[hub_id]}))
    return d


def local_models(tmp_path: Path) -> list[str]:
    """``--set`` overrides pointing multi_policy_math's models at local config directories."""
    return [
        f"policies.solver.model={qwen3_dir(tmp_path, 'Qwen/Qwen3-1.7B')}",
        f"policies.verifier.model={qwen3_dir(tmp_path, 'Qwen/Qwen3-0.6B')}",
    ]


def no_gpus() -> dict[str, str]:
    """An environment that names no GPU (the plan then takes the recipe's device numbers)."""
    return {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}


@pytest.fixture(autouse=True)
def _no_driver(monkeypatch):
    """Plan as on a machine whose GPUs are unknown, whatever this machine has."""
    monkeypatch.setattr(plan_mod, "visible_devices", lambda environ=None: _visible(environ))


def _visible(environ):
    env = os.environ if environ is None else environ
    if "CUDA_VISIBLE_DEVICES" in env:
        return tuple(d for d in env["CUDA_VISIBLE_DEVICES"].split(",") if d)
    return None


def launcher_envs(recipe, run_dir: Path, plan, monkeypatch) -> dict[str, dict[str, str]]:
    """The environment the local launcher gives each process it starts, read without starting
    any: ``Service.start`` records instead of spawning."""
    started: dict[str, dict[str, str]] = {}

    def record(self, env, cwd=None):
        started[self.name] = dict(env)
        return self

    monkeypatch.setattr(Service, "start", record)
    launcher = LocalLauncher(recipe, run_dir, plan=plan)
    launcher.security = RunSecurity.prepare(recipe, run_dir)
    launcher._env = service_env("secret")
    launcher.handle = RunHandle(run_dir, "http://127.0.0.1:9", "secret")
    launcher._start(launcher._dataflow(0))
    for group in recipe.trainer_processes():
        launcher._start(launcher._trainer(group[0], False))
    for i in range(recipe.rollout.nodes):
        launcher._start(launcher._node(i))
    return started


# ------------------------------------------------------------------------------------ devices
def test_multi_policy_recipe_gives_every_process_its_devices(tmp_path, monkeypatch):
    recipe = load_recipe(MULTI, [f"run.output_dir={tmp_path}"])
    plan = build_plan(recipe, tmp_path / "run", environ=no_gpus())
    visible = {p.name: p.visible for p in plan.processes}
    assert visible == {
        "dataflow": None,
        "trainer-solver": "0",
        "trainer-verifier": "1",
        "node-0": "2",
        "node-0/vllm-solver": "2",
        "node-0/vllm-verifier": "2",
        "node-1": "3",
        "node-1/vllm-solver": "3",
        "node-1/vllm-verifier": "3",
    }
    # what the launcher really passes to each process it starts
    envs = launcher_envs(recipe, tmp_path / "run", plan, monkeypatch)
    assert "CUDA_VISIBLE_DEVICES" not in envs["dataflow"] or envs["dataflow"][
        "CUDA_VISIBLE_DEVICES"
    ] == os.environ.get("CUDA_VISIBLE_DEVICES")
    assert envs["trainer-solver"]["CUDA_VISIBLE_DEVICES"] == "0"
    assert envs["trainer-verifier"]["CUDA_VISIBLE_DEVICES"] == "1"
    assert envs["node-0"]["CUDA_VISIBLE_DEVICES"] == "2"
    assert envs["node-1"]["CUDA_VISIBLE_DEVICES"] == "3"
    # the vLLM servers a node starts inherit its environment (VllmEngine: {**os.environ, ...})
    for i in (0, 1):
        for policy in ("solver", "verifier"):
            engine = plan.process(f"node-{i}/vllm-{policy}")
            assert engine.parent == f"node-{i}"
            assert engine.env == {"CUDA_VISIBLE_DEVICES": envs[f"node-{i}"]["CUDA_VISIBLE_DEVICES"]}
            assert "gpu_memory_utilization" in engine.engine_args


def test_devices_are_taken_from_the_launchers_own_visible_devices(tmp_path, monkeypatch):
    """Logical device N is the launcher's N-th visible GPU, so a launcher confined to GPUs 4-7
    never touches GPUs 0-3."""
    recipe = load_recipe(MULTI, [f"run.output_dir={tmp_path}"])
    plan = build_plan(recipe, tmp_path / "run", environ={"CUDA_VISIBLE_DEVICES": "4,5,6,7"})
    assert [plan.process(n).visible for n in ("trainer-solver", "trainer-verifier")] == ["4", "5"]
    assert [plan.process(f"node-{i}").visible for i in (0, 1)] == ["6", "7"]
    envs = launcher_envs(recipe, tmp_path / "run", plan, monkeypatch)
    assert envs["node-1"]["CUDA_VISIBLE_DEVICES"] == "7"
    # and a device the launcher cannot see is refused by name
    small = build_plan(recipe, tmp_path / "run", environ={"CUDA_VISIBLE_DEVICES": "4,5"})
    assert any("node-0 is planned on cuda:2" in p and "sees 2 GPU" in p for p in small.problems)


def test_node_flag_device_cuda_when_the_node_gets_its_devices(tmp_path):
    """``rollout.device = "cuda:1"`` becomes the node's CUDA_VISIBLE_DEVICES, so inside it the
    transformers engine must use device 0 (``--device cuda``), not cuda:1."""
    recipe = load_recipe(
        REPO / "recipes" / "quickstart.toml",
        [
            f"run.output_dir={tmp_path}",
            "rollout.device=cuda:1",
            "policies.policy.trainer.device=cuda:0",
        ],
    )
    plan = build_plan(recipe, tmp_path / "run", environ=no_gpus(), device_memory_gib=16)
    node = plan.process("node-0")
    assert node.visible == "1"
    assert node.argv[-2:] == ["--device", "cuda"]
    assert plan.process("trainer-policy").visible == "0"
    # the tiny model's trainer and in-process engine are on the devices they name
    assert set(plan.process("trainer-policy").memory_gib) == {0}
    assert set(node.memory_gib) == {1}


def test_torchrun_ranks_and_tensor_parallel_engines_get_adjacent_devices(tmp_path):
    recipe = load_recipe(
        MULTI,
        [
            f"run.output_dir={tmp_path}",
            "policies.solver.trainer.processes=2",
            "policies.solver.trainer.device=cuda:4",
            "policies.solver.engine_args.tensor_parallel_size=2",
            "rollout.devices=[[0, 1], [2, 3]]",
            "rollout.nodes=2",
            *local_models(tmp_path),
        ],
    )
    plan = build_plan(recipe, tmp_path / "run", environ=no_gpus())
    assert plan.process("trainer-solver").visible == "4,5"
    assert plan.process("trainer-solver/rank-0").devices == (4,)
    assert plan.process("trainer-solver/rank-1").devices == (5,)
    assert plan.process("node-1/vllm-solver").devices == (2, 3)
    assert set(plan.process("node-1/vllm-solver").memory_gib) == {2, 3}
    assert plan.process("node-1/vllm-verifier").devices == (2,)
    # a node given fewer devices than its tensor-parallel engine needs is refused by name
    narrow = load_recipe(
        MULTI,
        [
            f"run.output_dir={tmp_path}",
            "policies.solver.engine_args.tensor_parallel_size=2",
            "rollout.devices=[2, 3]",
            *local_models(tmp_path),
        ],
    )
    problems = build_plan(narrow, tmp_path / "run", environ=no_gpus()).problems
    assert any("node-0" in p and "tensor_parallel_size = 2" in p for p in problems), problems
    # derived from rollout.device, a tensor-parallel node takes adjacent devices N..N+k-1
    derived = load_recipe(
        MULTI,
        [
            f"run.output_dir={tmp_path}",
            "policies.solver.engine_args.tensor_parallel_size=2",
            "rollout.device=cuda:2",
            "rollout.nodes=1",
            *local_models(tmp_path),
        ],
    )
    derived = derived.model_copy(
        update={"rollout": derived.rollout.model_copy(update={"devices": None})}
    )
    assert (
        build_plan(derived, tmp_path / "run", environ=no_gpus()).process("node-0").visible == "2,3"
    )


def test_ray_services_take_the_gpus_ray_reserves(tmp_path):
    recipe = load_recipe(
        REPO / "recipes" / "gpu" / "ray_single_host.toml", [f"run.output_dir={tmp_path}"]
    )
    plan = build_plan(recipe, tmp_path / "run", environ=no_gpus())
    gpu = [p for p in plan.processes if p.kind in ("trainer", "node")]
    assert len(gpu) == 8
    assert all(p.env == {"CUDA_VISIBLE_DEVICES": RAY_GPUS} and p.ray_gpus == 1 for p in gpu)
    assert plan.process("dataflow").env == {}
    # each actor's device is its own (not summed across actors), holding its reserved share
    assert (
        "node-6 (Ray: 1 GPU) cuda:0: node-6/vllm-policy 0.85 x 80 GiB = 68.0 GiB of 80 GiB (ok)"
        in (plan.device_lines())
    )
    half = recipe.model_copy(
        update={
            "ray": recipe.ray.model_copy(
                update={"rollout": recipe.ray.rollout.model_copy(update={"num_gpus": 0.5})}
            )
        }
    )
    over = build_plan(half, tmp_path / "run", environ=no_gpus()).oversubscribed()
    assert (
        "node-0 (Ray: 0.5 GPU) cuda:0: node-0/vllm-policy 0.85 x 80 GiB = 68.0 GiB > 40 GiB" in over
    )
    # a GPU service whose Ray placement reserves no GPU would see none: refused by name
    bare = recipe.model_copy(
        update={"ray": recipe.ray.model_copy(update={"trainer": recipe.ray.dataflow})}
    )
    problems = build_plan(bare, tmp_path / "run", environ=no_gpus()).problems
    assert any(p.startswith("trainer-policy") and "num_gpus" in p for p in problems), problems


def test_ray_actor_sets_the_reserved_gpus(tmp_path, monkeypatch):
    """Outside Ray the actor's reserved GPUs are its own CUDA_VISIBLE_DEVICES: the service
    process gets them in place of the plan's placeholder."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5")
    log = tmp_path / "svc.log"
    argv = [sys.executable, "-c", "import os; print('CVD=' + os.environ['CUDA_VISIBLE_DEVICES'])"]
    actor = ServiceProcess("node-0", argv, str(log), {"CUDA_VISIBLE_DEVICES": RAY_GPUS}, [])
    assert actor.service.proc is not None
    actor.service.proc.wait(30)
    assert "CVD=5" in log.read_text()


# ------------------------------------------------------------------------------------ memory
def test_memory_formula_on_a_known_config():
    shape = model_shape("builtin:tiny-arith")
    n = shape.parameters
    assert (shape.hidden_size, shape.layers, shape.vocab_size) == (128, 4, 361)
    mem = trainer_memory(shape, dtype="bfloat16", rows=4, length=100, gradient_checkpointing=False)
    tokens = 400
    assert mem.master_weights == 4 * n and mem.gradients == 4 * n and mem.optimizer == 8 * n
    assert mem.compute_copy == 2 * n  # bf16 compute copy beside the fp32 masters
    assert mem.logits == tokens * 361 * 4
    assert mem.activations == 4 * 34 * 128 * tokens  # 34 x hidden bytes per token and layer
    assert mem.total == 18 * n + tokens * 361 * 4 + 4 * 34 * 128 * tokens
    fp32 = trainer_memory(shape, dtype="float32", rows=4, length=100, gradient_checkpointing=True)
    assert (
        fp32.compute_copy == 0 and fp32.master_weights + fp32.gradients + fp32.optimizer == 16 * n
    )
    assert fp32.activations == 4 * 128 * 4 * tokens + 68 * 128 * tokens  # inputs + one layer
    sharded = trainer_memory(
        shape, dtype="float32", rows=4, length=100, gradient_checkpointing=True, shards=2
    )
    assert sharded.optimizer == 4 * n


def test_parameters_are_counted_from_the_config_alone(tmp_path):
    shape = model_shape(str(qwen3_dir(tmp_path, "Qwen/Qwen3-0.6B")))
    assert shape.parameters == QWEN3_06B_PARAMETERS
    assert (shape.vocab_size, shape.hidden_size) == (151936, 1024)


def test_whole_batch_without_a_micro_batch_budget(tmp_path):
    """No ``trainer.micro_batch_tokens``: the largest micro-batch is the whole batch."""
    recipe = load_recipe(MULTI, [f"run.output_dir={tmp_path}", *local_models(tmp_path)])
    spec = recipe.policies["verifier"].trainer
    if getattr(spec, "micro_batch_tokens", None) is not None:
        recipe.policies["verifier"].trainer = spec.model_copy(update={"micro_batch_tokens": None})
    rows = plan_mod.micro_batch_rows(recipe, "verifier", 3072, ranks=1)
    assert rows == 16 * 8  # groups_per_step x group_size
    assert plan_mod.micro_batch_rows(recipe, "verifier", 3072, ranks=2) == 64


# ------------------------------------------------------------------------ fit and refusal
def test_multi_policy_recipe_fits(tmp_path):
    recipe = load_recipe(MULTI, [f"run.output_dir={tmp_path}", *local_models(tmp_path)])
    if getattr(recipe.policies["solver"].trainer, "micro_batch_tokens", None) is None:
        pytest.skip(
            "trainer.micro_batch_tokens is not in the recipe schema yet (issue 41 item 3): "
            "without it the solver's whole batch of logits (128 x 2048 x 151936 x 4 B) does "
            "not fit one device"
        )
    plan = build_plan(recipe, tmp_path / "run", environ=no_gpus(), device_memory_gib=80)
    plan.check()
    use = plan.device_use()
    assert sorted(use) == [0, 1, 2, 3]
    assert [p.name for p, _ in use[2]] == ["node-0/vllm-solver", "node-0/vllm-verifier"]
    assert sum(g for _, g in use[2]) == pytest.approx(0.8 * 80)


def test_oversubscribed_device_is_refused_with_names_and_numbers(tmp_path):
    recipe = load_recipe(
        MULTI,
        [
            f"run.output_dir={tmp_path}",
            "policies.verifier.trainer.device=cuda:0",
            "rollout.devices=[0, 0]",
            *local_models(tmp_path),
        ],
    )
    plan = build_plan(recipe, tmp_path / "run", environ=no_gpus(), device_memory_gib=80)
    [line] = plan.oversubscribed()
    verifier = plan.process("trainer-verifier").memory_gib[0]
    assert line.startswith("cuda:0: trainer-solver ")
    assert f"trainer-verifier {verifier:.1f} GiB" in line
    assert "node-0/vllm-solver 0.5 x 80 GiB + node-0/vllm-verifier 0.3 x 80 GiB" in line
    assert "node-1/vllm-verifier 0.3 x 80 GiB = " in line and line.endswith("> 80 GiB")
    total = sum(g for _, g in plan.device_use()[0])
    assert f"= {total:.1f} GiB > 80 GiB" in line
    with pytest.raises(PlanError, match="cuda:0: trainer-solver"):
        plan.check()
    # the launcher refuses it before writing or starting anything
    launcher = LocalLauncher(recipe, tmp_path / "run", plan=plan)
    with pytest.raises(LaunchError, match=r"> 80 GiB"):
        launcher.start()
    assert not (tmp_path / "run").exists()


def test_absent_model_is_named_with_what_to_do(tmp_path, monkeypatch):
    recipe = load_recipe(MULTI, [f"run.output_dir={tmp_path}"])
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    plan = build_plan(recipe, tmp_path / "run", environ=no_gpus())
    if not plan.problems:
        pytest.skip("Qwen/Qwen3-1.7B and Qwen3-0.6B are in this machine's Hugging Face cache")
    assert any(
        "policies.solver" in p and "'Qwen/Qwen3-1.7B' is absent" in p and "hf download" in p
        for p in plan.problems
    ), plan.problems
    with pytest.raises(PlanError, match="local checkpoint directory"):
        plan.check()


# ------------------------------------------------------------------------------------ CLI
def _cli(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "astraflow.cli.main", *args],
        capture_output=True,
        text=True,
        env={**env, "COLUMNS": "250"},
        cwd=cwd,
        timeout=180,
    )


def test_dry_run_prints_every_process_and_starts_none(tmp_path, monkeypatch):
    from astraflow.cli.main import app
    from typer.testing import CliRunner

    def refuse(self, env, cwd=None):
        raise AssertionError(f"--dry-run started {self.name}")

    monkeypatch.setattr(Service, "start", refuse)
    monkeypatch.setenv("COLUMNS", "250")
    args = ["train", str(MULTI), "--dry-run", "--set", f"run.output_dir={tmp_path}"]
    for s in local_models(tmp_path):
        args += ["--set", s]
    result = CliRunner().invoke(app, args)
    out = result.output
    fits = getattr(load_recipe(MULTI, []).policies["solver"].trainer, "micro_batch_tokens", None)
    assert result.exit_code == (0 if fits is not None else 2), out
    for name in ("dataflow", "trainer-solver", "trainer-verifier", "node-0", "node-1",
                 "node-0/vllm-solver", "node-1/vllm-verifier"):  # fmt: skip
        assert name in out
    assert "serve trainer" in out and "serve rollout" in out
    assert "device memory 80 GiB (default; set --device-memory-gib)" in out
    assert "cuda:2: node-0/vllm-solver 0.5 x 80 GiB + node-0/vllm-verifier 0.3 x 80 GiB" in out
    assert not any(tmp_path.glob("multi-policy*"))  # no run directory


@pytest.mark.refused_before_start
def test_train_refuses_an_oversubscribed_plan_before_starting(tmp_path):
    """The normal ``train`` (a real process) refuses what ``--dry-run`` refuses, before any
    service starts or the run directory is made."""
    args = ["train", str(MULTI), "--set", f"run.output_dir={tmp_path}",
            "--set", "policies.verifier.trainer.device=cuda:0", "--set", "rollout.devices=[0, 0]",
            "--device-memory-gib", "80"]  # fmt: skip
    for s in local_models(tmp_path):
        args += ["--set", s]
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "0,1,2,3"}  # four GPUs, whatever this machine has
    done = _cli(args, env, tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    err = " ".join(done.stderr.split())
    assert "cuda:0: trainer-solver" in err and "> 80 GiB" in err, err
    assert not any(tmp_path.glob("multi-policy*"))


def test_dry_run_reads_a_model_from_the_local_hugging_face_cache(tmp_path):
    """A hub id resolves in the local HF cache (config only), as on a GPU machine after
    ``hf download``."""
    cache = tmp_path / "hub"
    for hub_id in QWEN3_SIZES:
        repo = cache / ("models--" + hub_id.replace("/", "--"))
        snap = repo / "snapshots" / ("0" * 40)
        snap.mkdir(parents=True)
        (snap / "config.json").write_text(json.dumps({**_QWEN3, **QWEN3_SIZES[hub_id]}))
        (repo / "refs").mkdir()
        (repo / "refs" / "main").write_text("0" * 40)
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "0,1,2,3"}  # four GPUs, whatever this machine has
    env.update(HF_HUB_CACHE=str(cache), HF_HUB_OFFLINE="1")
    args = ["train", str(MULTI), "--dry-run", "--set", f"run.output_dir={tmp_path}",
            "--device-memory-gib", "1000"]  # fmt: skip
    done = _cli(args, env, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    out = " ".join(done.stdout.split())
    assert "trainer-solver" in out and "absent" not in out
    solver = [line for line in done.stdout.splitlines() if line.startswith("cuda:0:")]
    assert solver and "trainer-solver" in solver[0]
    gib = float(solver[0].split("trainer-solver ")[1].split(" GiB")[0])
    assert gib > 1.72e9 * 18 / GIB  # weights, grads and Adam state of 1.72B parameters at least


GPU_RECIPES = sorted((REPO / "recipes" / "gpu").glob("*.toml"))


@pytest.mark.parametrize("path", GPU_RECIPES, ids=lambda p: p.stem)
def test_every_gpu_recipe_plans_and_fits_one_80_gib_gpu_each(path, tmp_path):
    """Each GPU recipe's plan, with its models as Qwen3-shaped local configs: every process has
    its devices and memory, nothing is missing, and (with micro-batches) every device fits."""
    recipe = load_recipe(path, [f"run.output_dir={tmp_path}"])
    models = {}
    for name, policy in recipe.policies.items():
        if policy.model in QWEN3_SIZES:
            models[name] = f"policies.{name}.model={qwen3_dir(tmp_path, policy.model)}"
    assert models, f"{path.name}: no Qwen3 model to stand in for"
    recipe = load_recipe(path, [f"run.output_dir={tmp_path}", *models.values()])
    plan = build_plan(recipe, tmp_path / "run", environ=no_gpus(), device_memory_gib=80)
    assert plan.problems == []
    trainers = [p for p in plan.processes if p.kind in ("trainer", "rank") and p.memory_gib]
    assert trainers and all(p.visible or p.ray_gpus for p in trainers)
    assert any(p.kind == "engine" for p in plan.processes)
    if any(
        getattr(recipe.policies[p].trainer, "micro_batch_tokens", None) is None
        for p in recipe.trainable_policies()
    ):
        pytest.skip(
            "trainer.micro_batch_tokens is not in the recipe schema yet (issue 41 item 3): the "
            "whole batch's logits are planned, which no 80 GiB device holds"
        )
    plan.check()
