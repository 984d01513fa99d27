"""`run.launcher = "ray"` end to end on a local 2-node Ray cluster, and its errors.

The cluster is the one named by ``ASTRAFLOW_RAY_ADDRESS`` (CI starts it: ``.ci/run``), else one
this module starts and stops (two ``ray start`` processes, see ``bench/_ray_cluster.py``).
The second Ray node stands for another host: it has the label ``region=us-west`` and the custom
resource ``rollout_host``, which the recipe's ``[ray.rollout]`` asks for.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from test_train_e2e import _assert_exact_timeline, _start, _wait_for_step

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
from _ray_cluster import SECOND_NODE_LABEL, SECOND_NODE_RESOURCE, LocalRayCluster  # noqa: E402

ADDRESS_ENV = "ASTRAFLOW_RAY_ADDRESS"


@pytest.fixture(scope="module")
def ray_address():
    pytest.importorskip("ray", reason='Ray is not installed (pip install -e ".[ray]")')
    given = os.environ.get(ADDRESS_ENV)
    if given:
        yield given
        return
    cluster = LocalRayCluster.start()
    # the cluster runs without token auth (see _ray_cluster.py): so do its clients, the runs
    saved = os.environ.get("RAY_AUTH_MODE")
    os.environ["RAY_AUTH_MODE"] = "disabled"
    try:
        yield cluster.address
    finally:
        cluster.stop()
        if saved is None:
            os.environ.pop("RAY_AUTH_MODE", None)
        else:
            os.environ["RAY_AUTH_MODE"] = saved


@pytest.mark.nightly  # needs a Ray cluster (.ci/nightly starts one)
def test_quickstart_on_ray_survives_a_killed_trainer_actor(ray_address, tmp_path, still_running):
    """Quickstart with the Ray launcher: the rollout node lands on the second Ray node by its
    label (the dataflow and trainer off it by the same label), the trainer's actor is SIGKILLed once mid-run and restarted (resuming from its
    checkpoint), and the run ends with steps 1..12 trained once each."""
    key, value = SECOND_NODE_LABEL
    _, proc = _start(
        tmp_path,
        "run.launcher=ray",
        f"run.ray_address={ray_address}",
        f'ray.rollout.labels={{{key}="{value}"}}',
        f"ray.rollout.resources={{{SECOND_NODE_RESOURCE}=1}}",
        # the dataflow and the trainer kept off it: a label selector's "!value"
        f'ray.dataflow.labels={{{key}="!{value}"}}',
        f'ray.trainer.labels={{{key}="!{value}"}}',
        "run.restart_backoff_s=0.2",
        "run.max_steps=12",
    )
    run_dir = tmp_path / "quickstart"
    try:
        _wait_for_step(run_dir, 5, proc)
        actors = json.loads((run_dir / "actors.json").read_text())
        killed = actors["trainer-policy"]
        os.kill(killed["actor_pid"], signal.SIGKILL)
        out, _ = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
    assert proc.returncode == 0, out[-3000:]
    actors = json.loads((run_dir / "actors.json").read_text())
    assert actors["node-0"]["node_labels"].get(key) == value, actors
    assert actors["dataflow"]["node_labels"].get(key) != value, actors
    assert actors["trainer-policy"]["node_labels"].get(key) != value, actors
    assert actors["node-0"]["node_id"] != actors["trainer-policy"]["node_id"]
    assert actors["trainer-policy"]["actor_pid"] != killed["actor_pid"]  # a new actor
    events = [json.loads(line) for line in (run_dir / "restarts.jsonl").read_text().splitlines()]
    assert [(e["event"], e["service"]) for e in events] == [
        ("crash", "trainer-policy"),
        ("restart", "trainer-policy"),
    ]
    _assert_exact_timeline(run_dir, max_steps=12)
    pids = json.loads((run_dir / "pids.json").read_text())
    gone = {f"actor {name}": info["actor_pid"] for name, info in actors.items()}
    assert still_running({**gone, **pids}) == []


@pytest.mark.nightly
def test_autoscaled_pool_on_ray_grows_and_drains_node_actors(ray_address, tmp_path, still_running):
    """The autoscaler on the Ray launcher: grown nodes are node actors placed like the
    launcher's own, a shrink drains one through its actor (SIGTERM to its process), and the run
    passes the local test's checks (grew, then drained cleanly, nothing lost)."""
    from test_autoscale import check_grew_then_drained, train_autoscaled

    run_dir = train_autoscaled(
        tmp_path,
        "run.launcher=ray",
        f"run.ray_address={ray_address}",
        "ray.rollout.num_cpus=0",  # the test cluster's CPUs need not fit every grown node
    )
    check_grew_then_drained(run_dir, still_running)
    actors = json.loads((run_dir / "actors.json").read_text())
    log = [json.loads(line) for line in (run_dir / "autoscale.jsonl").read_text().splitlines()]
    grown = [n for r in log if r.get("decision") == "grow" for n in r["nodes"]]
    assert grown and all(actors[n]["actor_pid"] for n in grown)


def test_ray_launcher_without_ray_names_the_extra(tmp_path):
    """With Ray not importable, `astraflow train` on a Ray recipe fails at once, naming the
    extra to install (and starts nothing)."""
    code = (
        "import sys; sys.modules['ray'] = None\n"
        "from astraflow.cli.main import app\n"
        "app()\n"
    )  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "-c", code, "train", "recipes/quickstart.toml", "--no-live",
         "--set", "run.launcher=ray", "--set", f"run.output_dir={json.dumps(str(tmp_path))}"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
        env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "astraflow[ray]" in proc.stderr and "run.launcher" in proc.stderr, proc.stderr
    assert not (tmp_path / "quickstart" / "logs").exists()


def test_placement_from_the_recipe():
    """Each service's actor options come from its [ray] section; rollout pools in order."""
    from astraflow.launch.ray_launcher import actor_options
    from astraflow.recipe import recipe_from_dict

    recipe = recipe_from_dict(
        {
            "policies": {"policy": {"model": "builtin:tiny-arith"}},
            "rollout": {"nodes": 3},
            "ray": {
                "trainers": {"policy": {"num_gpus": 2, "resources": {"trainer_host": 1}}},
                "rollout_pools": [{"nodes": 2, "num_gpus": 1, "labels": {"region": "us-west"}}],
                "rollout": {"num_cpus": 0.5},
            },
        }
    )
    assert actor_options(recipe.ray.trainer_for("policy")) == {
        "num_gpus": 2,
        "resources": {"trainer_host": 1},
    }
    west = {"num_gpus": 1, "label_selector": {"region": "us-west"}}
    assert [actor_options(recipe.ray.node_for(i)) for i in range(3)] == [
        west,
        west,
        {"num_cpus": 0.5},
    ]
    assert actor_options(recipe.ray.dataflow) == {}


def test_a_multi_process_trainer_reserves_every_rank_in_one_bundle():
    """A trainer with N ranks runs in a placement group of one bundle holding N ranks' CPUs,
    GPUs and memory on one host (torchrun --standalone starts every rank beside the actor), and
    its actor takes the whole bundle; custom resources mark a kind of host and are asked once."""
    from astraflow.launch.ray_launcher import bundle_actor_options, trainer_bundle
    from astraflow.recipe.schema import RayPlacement

    place = RayPlacement(num_gpus=1, num_cpus=4, memory_gb=2, resources={"trainer_host": 1})
    bundle = trainer_bundle(place, 8)
    assert bundle == {"CPU": 32, "GPU": 8, "memory": 8 * 2 * 2**30, "trainer_host": 1}
    assert bundle_actor_options(bundle) == {
        "num_cpus": 32,
        "num_gpus": 8,
        "memory": 8 * 2 * 2**30,
        "resources": {"trainer_host": 1},
    }
    assert trainer_bundle(RayPlacement(), 2) == {"CPU": 2.0}  # Ray's 1 CPU per rank by default


def test_ray_recipes_check_without_importing_ray():
    """`astraflow recipe check` validates the Ray recipes for real hardware, and neither it nor
    `--help` imports Ray (the base install does not need it)."""
    code = (
        "import sys\n"
        "from astraflow.cli.main import app\n"
        "try:\n"
        "    app()\n"
        "except SystemExit as e:\n"
        "    assert not e.code, e.code\n"
        "assert 'ray' not in sys.modules, 'ray was imported'\n"
    )  # fmt: skip
    recipes = ["recipes/gpu/ray_single_host.toml", "recipes/gpu/ray_multi_host.toml"]
    proc = subprocess.run(
        [sys.executable, "-c", code, "recipe", "check", "--no-models", *recipes],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("ok ") == 2, proc.stdout
    from astraflow.recipe import load_recipe

    multi = load_recipe(ROOT / recipes[1])
    assert multi.run.launcher == "ray" and multi.dataflow.host == "0.0.0.0"
    pools = multi.ray.rollout_pools
    assert sum(p.nodes for p in pools) == multi.rollout.nodes
    assert {p.labels["region"] for p in pools} == {"us-west", "us-east"}
    assert "trainer_host" in multi.ray.trainer.resources
