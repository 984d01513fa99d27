"""The ``skyrl:``, ``textarena:`` and ``gym:`` env families on the real outside packages, and
their task sets (SkyRL's parquet layout as is, seeded instances)."""

from __future__ import annotations

import gymnasium as gym
import pytest
from astraflow.envs.ecosystems import family_spec
from astraflow.envs.registry import UnknownEnvError, default_registry
from astraflow.tasks.catalog import load_task_set
from gymnasium import spaces

ROWS = [
    {
        "data_source": "openai/gsm8k",
        "prompt": [
            {"role": "system", "content": "Answer after ####."},
            {"role": "user", "content": "What is 40 + 2?"},
        ],
        "env_class": "gsm8k_multi_turn",
        "reward_spec": {"method": "rule", "ground_truth": "42"},
        "extra_info": {"split": "train", "index": 7, "max_turns": 3},
    },
    {
        "data_source": "openai/gsm8k",
        "prompt": [{"role": "user", "content": "What is 3 + 4?"}],
        "env_class": "gsm8k_multi_turn",
        "reward_spec": {"method": "rule", "ground_truth": "7"},
        "extra_info": {"split": "train", "index": 8, "max_turns": 3},
    },
]


def write_skyrl_parquet(path) -> None:
    """A dataset file as SkyRL's own gsm8k preprocessing writes it (datasets -> parquet)."""
    import datasets

    datasets.Dataset.from_list(ROWS).to_parquet(str(path))


def test_skyrl_parquet_rows_load_as_they_are(tmp_path):
    pytest.importorskip("skyrl_gym")
    write_skyrl_parquet(tmp_path / "train.parquet")
    rows = load_task_set("skyrl_parquet", "train", path=str(tmp_path))
    assert [r["id"] for r in rows] == ["train-7", "train-8"]
    assert rows[0]["prompt"] == ROWS[0]["prompt"]
    assert rows[0]["reward_spec"] == {"method": "rule", "ground_truth": "42"}
    with pytest.raises(FileNotFoundError, match="kwargs.path"):
        load_task_set("skyrl_parquet", "test", path=str(tmp_path))


def test_skyrl_env_by_registered_id_keeps_chat_observations_and_turn_rewards(tmp_path):
    pytest.importorskip("skyrl_gym")
    write_skyrl_parquet(tmp_path / "train.parquet")
    row = load_task_set("skyrl_parquet", "train", path=str(tmp_path))[0]
    env = default_registry().make("skyrl:gsm8k_multi_turn", max_turns=3)
    obs, info = env.reset(options={"task": row})
    assert info["messages"] == ROWS[0]["prompt"]  # system turn kept
    assert obs == "What is 40 + 2?"
    obs, reward, terminated, truncated, info = env.step("I think #### 41")
    assert not terminated and not truncated
    assert 0 < reward < 1  # SkyRL's per-turn format score
    assert info["reward"] == reward
    assert info["messages"][0]["role"] == "user" and "####" in obs
    _obs, reward, terminated, _truncated, info = env.step("#### 42")
    assert terminated and reward == 1.0 and info["success"] is True


def test_skyrl_row_for_another_env_class_is_refused(tmp_path):
    pytest.importorskip("skyrl_gym")
    from astraflow.envs.base import TaskError

    env = default_registry().make("skyrl:gsm8k")
    with pytest.raises(TaskError, match="skyrl:gsm8k_multi_turn"):
        env.reset(options={"task": dict(ROWS[0])})
    with pytest.raises(ValueError, match="no SkyRL-gym env 'nope'"):
        default_registry().make("skyrl:nope")


def test_textarena_game_by_id_plays_to_a_reward():
    pytest.importorskip("textarena")
    tasks = load_task_set("textarena", "train", env="GuessTheNumber-v0", n=3)
    assert len({t["seed"] for t in tasks}) == 3
    env = default_registry().make("textarena:GuessTheNumber-v0", max_turns=10)
    obs, _ = env.reset(options={"task": tasks[0]})
    assert "Guess The Number" in obs
    lo, hi = 1, 20
    for _ in range(10):  # binary search from the game's hints wins
        guess = (lo + hi) // 2
        obs, reward, terminated, truncated, info = env.step(f"[{guess}]")
        if terminated or truncated:
            break
        assert "Guess The Number" not in obs  # only what is new since the last turn
        if "higher" in obs.lower():
            lo = guess + 1
        else:
            hi = guess - 1
    assert terminated and reward > 0 and info["success"]


class Echo(gym.Env):
    """A plain Gymnasium env with Text spaces: say the word it shows to win."""

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


def test_gym_family_runs_a_registered_text_env_on_seeded_resets():
    gym.register("ecotest/Echo-v0", entry_point=Echo)
    env = default_registry().make("gym:ecotest/Echo-v0", max_turns=3)
    task = load_task_set("gym_seeds", "train", env="ecotest/Echo-v0", n=2)[1]
    first, _ = env.reset(options={"task": task})
    again, _ = env.reset(options={"task": task})
    assert first == again and first.startswith("say ")
    _, reward, terminated, _, _ = env.step(first.removeprefix("say "))
    assert terminated and reward == 1.0
    env.reset(options={"task": task})
    _, reward, terminated, truncated, info = env.step("nope")
    assert truncated and not terminated and reward == 0.0 and info["success"] is False


def test_family_ids_resolve_by_prefix_only():
    assert family_spec("astraflow/Math-v0") is None
    assert family_spec("acme:thing") is None
    spec = family_spec("skyrl:gsm8k")
    assert spec.kwargs == {"env_name": "gsm8k"} and spec.source == "skyrl-gym"
    with pytest.raises(ValueError, match="expected textarena:NAME"):
        family_spec("textarena:")
    with pytest.raises(UnknownEnvError):
        default_registry().get("acme:thing")


def test_missing_package_names_the_extra(monkeypatch):
    from astraflow.envs import ecosystems

    family = ecosystems.FAMILIES["textarena"]
    monkeypatch.setitem(
        ecosystems.FAMILIES,
        "textarena",
        ecosystems.EnvFamily(**{**family.__dict__, "module": "no_such_textarena_module"}),
    )
    with pytest.raises(ImportError, match=r"astraflow\[ecosystems\]"):
        default_registry().make("textarena:GuessTheNumber-v0")


@pytest.mark.parametrize(
    ("env_id", "package"),
    [("skyrl:gsm8k_multi_turn", "skyrl_gym"), ("textarena:Blackjack-v0", "textarena")],
)
def test_envs_check_passes_on_family_ids(env_id, package):
    pytest.importorskip(package)
    from astraflow.cli.envs import check_one

    row = check_one(env_id, {"max_turns": 3}, episodes=2, seed=0, max_action_chars=40)
    assert row["ok"], row.get("traceback")
