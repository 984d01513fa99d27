"""`astraflow train` with a two-process trainer (torchrun, gloo on CPU) under the local launcher.

Rank 0 alone pulls batches, acknowledges and publishes; rank 1 trains its share of every batch.
A killed trainer (torchrun and its ranks) is restarted from its checkpoint, and the run still
ends with every step trained exactly once.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from test_train_e2e import (
    _assert_exact_timeline,
    _kill_at_step,
    _records,
    _start,
    _train,
)

TWO = "policies.policy.trainer.processes=2"


def _children(pid: int) -> list[int]:
    """PIDs whose parent is ``pid`` (torchrun's ranks)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


@pytest.mark.slow
def test_quickstart_with_two_trainer_processes(tmp_path):
    proc = _train(tmp_path, TWO)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    run_dir = tmp_path / "quickstart"
    _assert_exact_timeline(run_dir, max_steps=4)
    log = (run_dir / "logs" / "trainer-policy.log").read_text()
    assert "trainer rank 1 (rank 0 talks to the dataflow)" in log  # two ranks really ran
    published = re.findall(r"published policy v(\d+)", log)
    assert published == ["0", "1", "2", "3", "4"]  # exactly one publication per step
    # every sample of each global batch was trained (rank 0 reports the gathered count)
    steps = _records(run_dir, "step")
    assert all(r["metrics"]["samples"] == 8.0 for r in steps), [r["metrics"] for r in steps]


@pytest.mark.slow
def test_two_process_trainer_killed_is_restarted_and_trains_each_step_once(tmp_path, still_running):
    _, proc = _start(tmp_path, TWO, "run.restart_backoff_s=0.2", "run.max_steps=10",
                     "evaluation.every_steps=0")  # fmt: skip
    run_dir = tmp_path / "quickstart"
    try:
        from test_train_e2e import _wait_for_step

        _wait_for_step(run_dir, 4, proc)
        torchrun = json.loads((run_dir / "pids.json").read_text())["trainer-policy"]
        ranks = _children(torchrun)
        assert len(ranks) == 2, ranks
        _kill_at_step(run_dir, proc, 4, "trainer-policy")
        out, _ = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out[-3000:]
    events = [json.loads(line) for line in (run_dir / "restarts.jsonl").read_text().splitlines()]
    assert [(e["event"], e["service"]) for e in events] == [
        ("crash", "trainer-policy"), ("restart", "trainer-policy"),
    ]  # fmt: skip
    _assert_exact_timeline(run_dir, max_steps=10)
    # the killed trainer's ranks died with it
    assert still_running({f"rank {i}": pid for i, pid in enumerate(ranks)}) == []
    pids = json.loads((run_dir / "pids.json").read_text())
    assert still_running(pids) == []


def test_two_process_command_line(tmp_path):
    """The launcher's trainer command: torchrun with N ranks, or accelerate with a config."""
    from astraflow.launch.trainer_command import trainer_argv
    from astraflow.recipe import load_recipe

    root = Path(__file__).resolve().parents[2]
    recipe = load_recipe(root / "recipes" / "quickstart.toml", [TWO])
    argv = trainer_argv(recipe, tmp_path / "r.toml", "policy", "http://h:1", tmp_path, resume=True)
    assert argv[1:6] == ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    assert argv[6:10] == ["-m", "astraflow.cli.main", "serve", "trainer"] and argv[-1] == "--resume"
    config = tmp_path / "fsdp.yaml"
    config.write_text("distributed_type: FSDP\n")
    recipe = load_recipe(root / "recipes" / "quickstart.toml",
                         [TWO, f"policies.policy.trainer.accelerate_config={json.dumps(str(config))}"])  # fmt: skip
    argv = trainer_argv(recipe, tmp_path / "r.toml", "policy", "http://h:1", tmp_path)
    assert argv[1:7] == ["-m", "accelerate.commands.launch", "--config_file", str(config),
                         "--num_processes", "2"]  # fmt: skip
    assert "--resume" not in argv
    single = trainer_argv(load_recipe(root / "recipes" / "quickstart.toml"), tmp_path / "r.toml",
                          "policy", "http://h:1", tmp_path)  # fmt: skip
    assert single[1:5] == ["-m", "astraflow.cli.main", "serve", "trainer"]
    missing = load_recipe(root / "recipes" / "quickstart.toml",
                          ['policies.policy.trainer.accelerate_config="/nonexistent.yaml"'])  # fmt: skip
    with pytest.raises(ValueError, match=r"policies\.policy\.trainer\.accelerate_config"):
        trainer_argv(missing, tmp_path / "r.toml", "policy", "http://h:1", tmp_path)


def test_processes_must_be_positive():
    from astraflow.recipe import RecipeError, load_recipe

    root = Path(__file__).resolve().parents[2]
    with pytest.raises(RecipeError, match="processes"):
        load_recipe(root / "recipes" / "quickstart.toml", ["policies.policy.trainer.processes=0"])


def test_missing_accelerate_config_fails_before_anything_starts(tmp_path):
    import sys

    root = Path(__file__).resolve().parents[2]
    missing = tmp_path / "missing.yaml"
    proc = subprocess.run(
        [sys.executable, "-m", "astraflow.cli.main", "train", "recipes/quickstart.toml", "--no-live",
         "--set", f"run.output_dir={json.dumps(str(tmp_path / 'runs'))}",
         "--set", f"policies.policy.trainer.accelerate_config={json.dumps(str(missing))}"],
        cwd=root, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode != 0
    assert "policies.policy.trainer.accelerate_config" in proc.stdout + proc.stderr
    assert not (tmp_path / "runs").exists()  # no run directory, no service started
