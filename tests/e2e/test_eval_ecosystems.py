"""``astraflow eval run`` on each env family from another ecosystem, by id only: a SkyRL-gym env on
a SkyRL parquet file, a TextArena game, a Gymnasium text env (registered by its own module, named
``gym:module:ID`` as Gymnasium's ``make`` takes it). The verifiers family's eval run is in
tests/envs/test_verifiers_env.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "envs"))

ECHO_MODULE = '''
import gymnasium as gym
from gymnasium import spaces


class Echo(gym.Env):
    """Say the word it shows to win."""

    def __init__(self):
        self.observation_space = spaces.Text(32)
        self.action_space = spaces.Text(32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.word = ["red", "green", "blue"][int(self.np_random.integers(3))]
        return f"say {self.word}", {}

    def step(self, action):
        won = action.strip() == self.word
        return ("right" if won else "wrong"), float(won), won, not won, {}


gym.register("echo_env/Echo-v0", entry_point=Echo)
'''


def eval_run(tmp_path: Path, env: str, tasks: str, *extra: str, pythonpath: str = "", n: int = 4):
    out = tmp_path / "report.json"
    argv = [sys.executable, "-m", "astraflow.cli.main", "eval", "run", "--policy", "builtin:tiny-tools",
            "--env", env, "--tasks", tasks, "--limit", "4", "--max-tokens", "16",
            "--device", "cpu", "--out", str(out), *extra]  # fmt: skip
    path = os.pathsep.join(p for p in (pythonpath, os.environ.get("PYTHONPATH", "")) if p)
    proc = subprocess.run(
        argv, cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={**os.environ, "COLUMNS": "200", "PYTHONPATH": path},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["meta"]["env"] == env
    assert report["summary"]["errors"] == 0, report["samples"][:2]
    assert len(report["samples"]) == n and all(r["transcript"] for r in report["samples"])
    return report


@pytest.mark.slow
def test_eval_run_on_a_skyrl_env(tmp_path):
    pytest.importorskip("skyrl_gym", reason="skyrl-gym is in the ecosystems and test extras")
    from test_ecosystems import write_skyrl_parquet

    write_skyrl_parquet(tmp_path / "test.parquet")
    report = eval_run(tmp_path, "skyrl:gsm8k_multi_turn", "skyrl_parquet:test",
                      "--kwarg", f"path={tmp_path}", "--max-turns", "2", n=2)  # fmt: skip
    assert report["summary"]["tasks"] == 2  # the file's two rows


@pytest.mark.slow
def test_eval_run_on_a_textarena_game(tmp_path):
    pytest.importorskip("textarena", reason="textarena is in the ecosystems and test extras")
    eval_run(tmp_path, "textarena:GuessTheNumber-v0", "textarena:test",
             "--kwarg", "env=GuessTheNumber-v0", "--kwarg", "n=4", "--max-turns", "2")  # fmt: skip


@pytest.mark.slow
def test_eval_run_on_a_gymnasium_text_env(tmp_path):
    (tmp_path / "echo_env.py").write_text(ECHO_MODULE)
    report = eval_run(tmp_path, "gym:echo_env:echo_env/Echo-v0", "gym_seeds:test",
                      "--kwarg", "env=echo_env/Echo-v0", "--kwarg", "n=4", "--max-turns", "2",
                      pythonpath=str(tmp_path))  # fmt: skip
    assert report["summary"]["tasks"] == 4
