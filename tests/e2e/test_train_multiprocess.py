"""`astraflow train` with a two-process trainer (torchrun, gloo on CPU) under the local launcher.

Rank 0 alone pulls batches, acknowledges and publishes; rank 1 trains its share of every batch.
The whole runs with two trainer processes are the shared ones: tests/e2e/test_quickstart_run.py
(each step trained and published once) and tests/e2e/test_restart_run.py (a killed two-process
trainer is restarted, its ranks die with it, every step trained once). Here: the command line.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

TWO = "policies.policy.trainer.processes=2"


def test_two_process_command_line(tmp_path):
    """The launcher's trainer command: torchrun with N ranks, or accelerate with a config."""
    from astraflow.launch.trainer_command import trainer_argv
    from astraflow.recipe import load_recipe

    root = Path(__file__).resolve().parents[2]
    recipe = load_recipe(root / "recipes" / "quickstart.toml", [TWO])
    argv = trainer_argv(recipe, tmp_path / "r.toml", "policy", "http://h:1", tmp_path, resume=True)
    assert argv[1:6] == ["-m", "astraflow.launch.torchrun", "--standalone", "--nproc_per_node", "2"]
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


@pytest.mark.refused_before_start
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
