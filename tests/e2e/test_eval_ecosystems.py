"""``astraflow eval run`` on each env family from another ecosystem, by id only: a SkyRL-gym env on
a SkyRL parquet file, TextArena games, a Gymnasium text env (registered by its own module, named
``gym:module:ID`` as Gymnasium's ``make`` takes it), verifiers environments (single-turn, multi-turn
and a tool env through function calling, from a tiny environments package installed beside
verifiers).

An eval run plays its episodes through the rollout node's own path (workflow, engine, env runner),
so a report row with generated tokens is an episode a trainer could take: these runs are how the
families other than the one trained in tests/e2e/test_train_ecosystems.py (TextArena self-play)
show their episodes are trainable. Rows sampled at temperature 1, as in training."""

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


def eval_run(tmp_path: Path, env: str, tasks: str, *extra: str, pythonpath: str = "", n: int = 4,
             policy: str = "builtin:tiny-tools", limit: int = 4, max_tokens: int = 16,
             trainable: bool = True):  # fmt: skip
    out = tmp_path / "report.json"
    argv = [sys.executable, "-m", "astraflow.cli.main", "eval", "run", "--policy", policy,
            "--env", env, "--tasks", tasks, "--limit", str(limit), "--max-tokens", str(max_tokens),
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
    # trainable: every episode generated tokens (loss mask 1) at the policy's weight version
    if trainable:
        assert all(r["tokens"] > 0 and r["versions"] == [0] for r in report["samples"])
    return report


@pytest.mark.slow
def test_eval_run_on_a_skyrl_env(tmp_path):
    pytest.importorskip("skyrl_gym", reason="skyrl-gym is in the ecosystems and test extras")
    from test_ecosystems import write_skyrl_parquet

    write_skyrl_parquet(tmp_path / "test.parquet")
    report = eval_run(tmp_path, "skyrl:gsm8k_multi_turn", "skyrl_parquet:test",
                      "--kwarg", f"path={tmp_path}", "--max-turns", "2",
                      "--samples", "4", "--temperature", "1.0", n=8)  # fmt: skip
    assert report["summary"]["tasks"] == 2  # the file's two rows
    # SkyRL's follow-up user turn was rendered and answered: a second turn in one sequence
    assert any(r["turns"] == 2 for r in report["samples"]), report["samples"][:2]


@pytest.mark.slow
def test_eval_run_on_a_textarena_game(tmp_path):
    pytest.importorskip("textarena", reason="textarena is in the ecosystems and test extras")
    eval_run(tmp_path, "textarena:GuessTheNumber-v0", "textarena:test",
             "--kwarg", "env=GuessTheNumber-v0", "--kwarg", "n=4", "--max-turns", "2",
             # its opening outgrows the tiny policy's context: the episodes end with "length"
             trainable=False)  # fmt: skip


@pytest.mark.slow
def test_eval_run_on_a_gymnasium_text_env(tmp_path):
    (tmp_path / "echo_env.py").write_text(ECHO_MODULE)
    report = eval_run(tmp_path, "gym:echo_env:echo_env/Echo-v0", "gym_seeds:test",
                      "--kwarg", "env=echo_env/Echo-v0", "--kwarg", "n=4", "--max-turns", "2",
                      pythonpath=str(tmp_path))  # fmt: skip
    assert report["summary"]["tasks"] == 4


def _vf_path(tmp_path: Path) -> str:
    """The tiny verifiers environments package, installed for the eval run."""
    pytest.importorskip("verifiers", reason="verifiers is in the ecosystems and test extras")
    from test_verifiers_env import install_vf_pkg

    return str(install_vf_pkg(tmp_path / "site"))


@pytest.mark.slow
def test_eval_run_on_a_verifiers_single_turn_environment(tmp_path):
    """``astraflow eval run`` takes the family id and the task set like any other; the
    environment's rubric scores every episode (was tests/envs/test_verifiers_env.py's eval run)."""
    report = eval_run(tmp_path, "verifiers:vf_tiny_arith", "verifiers:test",
                      "--kwarg", "env=vf_tiny_arith", "--samples", "2", "--temperature", "1.0",
                      pythonpath=_vf_path(tmp_path), policy="builtin:tiny-arith", limit=8,
                      max_tokens=8, n=16)  # fmt: skip
    assert any(r["reward"] == 1.0 for r in report["samples"]), report["samples"][:3]


@pytest.mark.slow
def test_eval_run_on_a_verifiers_multi_turn_environment(tmp_path):
    report = eval_run(tmp_path, "verifiers:vf_tiny_retry", "verifiers:test",
                      "--kwarg", "env=vf_tiny_retry", "--max-turns", "3", "--samples", "2",
                      "--temperature", "1.0", pythonpath=_vf_path(tmp_path),
                      policy="builtin:tiny-arith", limit=8, max_tokens=8, n=16)  # fmt: skip
    # a wrong first answer got the environment's second prompt: two turns, scored at the end
    turns = [r["turns"] for r in report["samples"]]
    assert any(t == 2 for t in turns) and all(t <= 2 for t in turns), turns


@pytest.mark.slow
def test_eval_run_on_a_verifiers_tool_environment_through_function_calling(tmp_path):
    report = eval_run(tmp_path, "verifiers:vf_tiny_calc", "verifiers:test",
                      "--kwarg", "env=vf_tiny_calc", "--workflow", "tool_agent",
                      "--tool-parser", "hermes", "--max-turns", "2", "--samples", "2",
                      "--temperature", "1.0", pythonpath=_vf_path(tmp_path),
                      limit=8, max_tokens=100, n=16)  # fmt: skip
    # the policy's calls ran the environment's own Python tool
    assert any(r.get("tool_calls", 0) >= 1 for r in report["samples"]), report["samples"][:3]


@pytest.mark.slow
def test_eval_run_on_a_textarena_blackjack_game(tmp_path):
    """The single-player game the TextArena family trained on (Blackjack-v0)."""
    pytest.importorskip("textarena", reason="textarena is in the ecosystems and test extras")
    eval_run(tmp_path, "textarena:Blackjack-v0", "textarena:test", "--kwarg", "env=Blackjack-v0",
             "--kwarg", "n=4", "--max-turns", "3", "--temperature", "1.0")  # fmt: skip
