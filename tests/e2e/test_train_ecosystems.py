"""Real training steps on an env from another ecosystem, installed from its real package and named
by id only (no adapter code here): ONE run, a two-player TextArena game trained by self-play.

The trainer side of every ecosystem family is the same (token sequences, loss masks, rewards), so
one run trains, the one that proves the most: a family adapter under a multi-role workflow, two
samples per episode from one policy, each role with its own view of the game. The other families
reach trainable episodes through ``astraflow eval run`` (the rollout node's own workflow, engine and
env runner) in tests/e2e/test_eval_ecosystems.py: SkyRL-gym's multi-turn GSM8K on a SkyRL parquet
file, TextArena single-player games, verifiers environments (single-turn, multi-turn and a tool env
through function calling); their adapters are driven in tests/envs/test_ecosystems.py and
tests/envs/test_verifiers_env.py."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from astraflow.dataflow.storage import history

TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS / "tools"))
from quickstart_run import TWO_SMALL_STEPS, QuickstartRun, train_quickstart  # noqa: E402

pytestmark = pytest.mark.slow

#: the untrained policy's rewards may be all equal: keep every group (no zero-variance filter)
KEEP_ALL = 'dataflow.policies=[{ name = "staleness", kwargs = { max_staleness = 2 } }]'


@pytest.fixture(scope="module")
def self_play(tmp_path_factory) -> QuickstartRun:
    """A two-player TextArena game as multi-role episodes: both players are the one policy (two
    samples per episode), each with its own view of the game. Truth and Deception takes any text
    as a move (a conversation), so the untrained policy's turns alternate between the players."""
    pytest.importorskip("textarena", reason="textarena is in the ecosystems and test extras")
    return train_quickstart(
        tmp_path_factory.mktemp("textarena-self-play"),
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


def test_textarena_two_player_game_trains_by_self_play(self_play):
    assert self_play.step_versions == [1, 2]
    samples = self_play.read(history.samples)
    assert {r.role for r in samples} == {"player_0", "player_1"}
    assert {r.policy for r in samples} == {"policy"}  # one policy plays both seats
    assert any(r.batch_id for r in samples)  # the trainer was served them
    assert all(r.n_tokens > 0 for r in samples)
    episodes = self_play.episodes()
    errors = [info for reason, info in episodes if reason == "error"]
    assert episodes and not errors, errors[:3]
