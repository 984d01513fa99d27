"""Real training steps on the built-in tiny policy over envs from other ecosystems, installed from
their real packages and named by id only (no adapter code here): SkyRL-gym's multi-turn GSM8K on
a SkyRL parquet file, verifiers environments (single-turn, multi-turn and a tool env, from a tiny
environments package installed beside verifiers) on their own datasets, a TextArena game
(Blackjack) on seeded instances."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from astraflow.dataflow.storage import history

TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS / "tools"))
sys.path.insert(0, str(TESTS / "envs"))
from quickstart_run import TWO_SMALL_STEPS, train_quickstart  # noqa: E402
from test_ecosystems import write_skyrl_parquet  # noqa: E402

#: the untrained policy's rewards may be all equal: keep every group (no zero-variance filter)
KEEP_ALL = 'dataflow.policies=[{ name = "staleness", kwargs = { max_staleness = 2 } }]'


def train_on(
    tmp_path: Path,
    env: str,
    task_set: str,
    max_turns: int,
    *extra: str,
    environ: dict[str, str] | None = None,
) -> list[tuple[str, dict]]:
    run = train_quickstart(
        tmp_path,
        [
            f"tasks.env={json.dumps(env)}",
            f"tasks.sets=[{task_set}]",
            f"workflow.max_turns={max_turns}",
            KEEP_ALL,
            *TWO_SMALL_STEPS,
            *extra,
        ],
        env=environ,
    )
    assert run.step_versions == [1, 2]
    episodes = run.episodes()
    errors = [info for reason, info in episodes if reason == "error"]
    assert episodes and not errors, errors[:3]
    return episodes


@pytest.mark.slow
def test_skyrl_gym_multi_turn_gsm8k_trains(tmp_path):
    pytest.importorskip("skyrl_gym", reason="skyrl-gym is in the ecosystems and test extras")
    write_skyrl_parquet(tmp_path / "train.parquet")
    path = json.dumps(str(tmp_path))
    infos = train_on(
        tmp_path,
        "skyrl:gsm8k_multi_turn",
        f'{{ name = "skyrl_parquet", kwargs = {{ path = {path} }} }}',
        3,
        # the tiny policy's 256-token context holds two turns of SkyRL's prompts
        "workflow.kwargs={ max_total_tokens = 240 }",
    )
    # SkyRL's follow-up user turns were rendered and each turn's reward kept on its own
    assert any(len(info["info"]["turn_rewards"]) == 2 for _reason, info in infos)


@pytest.mark.slow
def test_textarena_game_trains(tmp_path):
    pytest.importorskip("textarena", reason="textarena is in the ecosystems and test extras")
    infos = train_on(
        tmp_path,
        "textarena:Blackjack-v0",
        '{ name = "textarena", kwargs = { env = "Blackjack-v0", n = 8 } }',
        3,
        # Blackjack's opening (~310 characters) needs the 512-token tiny policy
        'policies.policy.model="builtin:tiny-tools"',
        "policies.policy.sampling.max_tokens=16",
        "workflow.kwargs={ max_total_tokens = 480 }",
    )
    assert all(len(info["info"]["turn_rewards"]) >= 1 for _reason, info in infos)


def _vf_environ(tmp_path: Path) -> dict[str, str]:
    """The tiny verifiers environments package, installed for the run's services."""
    pytest.importorskip("verifiers", reason="verifiers is in the ecosystems and test extras")
    from test_verifiers_env import install_vf_pkg

    site = install_vf_pkg(tmp_path / "site")
    return {"PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}


def _vf_set(name: str) -> str:
    return f'{{ name = "verifiers", kwargs = {{ env = "{name}" }} }}'


@pytest.mark.slow
def test_verifiers_single_turn_environment_trains(tmp_path):
    infos = train_on(tmp_path, "verifiers:vf_tiny_arith", _vf_set("vf_tiny_arith"), 1,
                     environ=_vf_environ(tmp_path))  # fmt: skip
    # the rubric scored every episode (its reward function's metric is in the episode info)
    assert all("correct" in info["info"]["metrics"] for _reason, info in infos)
    assert any(info["info"]["reward"] == 1.0 for _reason, info in infos)


@pytest.mark.slow
def test_verifiers_multi_turn_environment_trains(tmp_path):
    infos = train_on(tmp_path, "verifiers:vf_tiny_retry", _vf_set("vf_tiny_retry"), 3,
                     environ=_vf_environ(tmp_path))  # fmt: skip
    # a wrong first answer got the environment's second prompt: two turns, scored at the end
    assert any(info["info"]["metrics"]["num_turns"] == 2.0 for _reason, info in infos)
    assert all(len(info["info"]["turn_rewards"]) <= 2 for _reason, info in infos)


@pytest.mark.slow
def test_verifiers_tool_environment_trains_through_function_calling(tmp_path):
    infos = train_on(
        tmp_path,
        "verifiers:vf_tiny_calc",
        _vf_set("vf_tiny_calc"),
        2,
        'workflow.name="tool_agent"',
        'policies.policy.model="builtin:tiny-tools"',
        'policies.policy.tool_parser="hermes"',
        "policies.policy.sampling.max_tokens=100",
        "workflow.kwargs={ max_total_tokens = 480 }",
        environ=_vf_environ(tmp_path),
    )
    # the policy's calls ran the environment's own Python tool (verifiers counts them)
    calls = [info["info"].get("metrics", {}).get("calculator_calls", 0) for _r, info in infos]
    assert any(n >= 1 for n in calls), infos[:3]


@pytest.mark.slow
def test_textarena_two_player_game_trains_by_self_play(tmp_path):
    """A two-player TextArena game as multi-role episodes: both players are the one policy (two
    samples per episode), each with its own view of the game. Truth and Deception takes any text
    as a move (a conversation), so the untrained policy's turns alternate between the players."""
    pytest.importorskip("textarena", reason="textarena is in the ecosystems and test extras")
    run = train_quickstart(
        tmp_path,
        [
            'tasks.env="textarena:TruthAndDeception-v0"',
            "tasks.env_kwargs={ num_players = 2 }",
            'tasks.sets=[{ name = "textarena", kwargs = { env = "TruthAndDeception-v0", n = 8 } }]',
            'workflow.name="turn_taking"',
            'workflow.roles={ player_0 = "policy", player_1 = "policy" }',
            "workflow.max_turns=6",
            # the game's openings (~460 characters) fill most of the tiny policy's 512 tokens
            'policies.policy.model="builtin:tiny-tools"',
            "policies.policy.sampling.max_tokens=8",
            "workflow.kwargs={ max_total_tokens = 511 }",
            KEEP_ALL,
            *TWO_SMALL_STEPS,
        ],
    )
    assert run.step_versions == [1, 2]
    roles = {r.role for r in run.read(history.samples)}
    assert roles == {"player_0", "player_1"}
    errors = [info for reason, info in run.episodes() if reason == "error"]
    assert not errors, errors[:3]
