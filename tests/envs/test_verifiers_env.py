"""The ``verifiers:NAME`` env family and the ``verifiers`` task set on the real verifiers package.

The environments are a tiny package of three verifiers environments (tests/envs/vf_pkg: a
SingleTurnEnv, a MultiTurnEnv and a ToolEnv, each built from an in-memory dataset with a rubric),
"installed" as pip would lay it out (the modules plus their dist-info on the path), so nothing is
downloaded. The adapter runs each environment's own rollout loop and rubric.
"""

from __future__ import annotations

import shutil
import signal
import sys
import threading
from pathlib import Path

import pytest

pytest.importorskip("verifiers", reason="verifiers is in the ecosystems and test extras")

VF_SRC = Path(__file__).parent / "vf_pkg"
MODULES = ("vf_tiny_arith", "vf_tiny_retry", "vf_tiny_calc")


def install_vf_pkg(site: Path) -> Path:
    """Copy the tiny environments package into ``site`` as pip would install it."""
    site.mkdir(parents=True, exist_ok=True)
    for name in MODULES:
        shutil.copy(VF_SRC / f"{name}.py", site / f"{name}.py")
    dist = site / "vf_tiny_envs-0.1.0.dist-info"
    dist.mkdir(exist_ok=True)
    (dist / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: vf-tiny-envs\nVersion: 0.1.0\nRequires-Dist: verifiers\n"
    )
    (dist / "top_level.txt").write_text("\n".join(MODULES) + "\n")
    return site


@pytest.fixture(scope="module")
def vf_site(tmp_path_factory):
    site = install_vf_pkg(tmp_path_factory.mktemp("vf_site"))
    sys.path.insert(0, str(site))
    yield site
    sys.path.remove(str(site))


def _make(env_id: str, **kwargs):
    from astraflow.envs.registry import default_registry

    return default_registry().make(env_id, **kwargs)


def _rows(name: str, split: str = "train", **kwargs):
    from astraflow.tasks.catalog import load_task_set

    return load_task_set("verifiers", split, env=name, **kwargs)


def test_task_set_is_the_environments_own_dataset(vf_site):
    train, test = _rows("vf_tiny_arith"), _rows("vf_tiny_arith", "test")
    assert len(train) == 64 and len(test) == 16
    assert train[0]["id"] == "vf_tiny_arith/train-0"
    assert train[0]["prompt"] == [{"role": "user", "content": train[0]["question"]}]
    assert {r["question"] for r in train}.isdisjoint({r["question"] for r in test})
    assert len(_rows("vf_tiny_arith", n=5)) == 5
    assert len(_rows("vf_tiny_arith", env_args={"num_train": 8})) == 8


def test_single_turn_rubric_is_the_reward(vf_site):
    row = _rows("vf_tiny_arith")[0]
    env = _make("verifiers:vf_tiny_arith")
    try:
        obs, info = env.reset(options={"task": row})
        assert obs == row["question"] and info["messages"] == row["prompt"]
        _obs, reward, terminated, truncated, info = env.step(row["answer"])
        assert (reward, terminated, truncated, info["success"]) == (1.0, True, False, True)
        assert info["reward"] == 1.0 and info["metrics"]["correct"] == 1.0
        env.reset(options={"task": row})
        _obs, reward, terminated, _t, info = env.step(row["answer"] + "0")
        assert (reward, terminated, info["success"]) == (0.0, True, False)
    finally:
        env.close()


def test_multi_turn_env_response_comes_back_as_chat_messages(vf_site):
    row = _rows("vf_tiny_retry")[0]
    env = _make("verifiers:vf_tiny_retry", max_turns=4)
    try:
        env.reset(options={"task": row})
        obs, reward, terminated, truncated, info = env.step("wrong")
        assert (reward, terminated, truncated) == (0.0, False, False)
        assert info["messages"] == [{"role": "user", "content": f"Not quite. Again: {obs[18:]}"}]
        _obs, reward, terminated, _t, info = env.step(row["answer"])
        assert (reward, terminated) == (1.0, True)
        assert info["metrics"]["num_turns"] == 2.0
        # the environment's own max_turns (2) ends a rollout that never got it right
        env.reset(options={"task": row})
        env.step("no")
        _obs, reward, terminated, _t, info = env.step("still no")
        assert (reward, terminated, info["stop_condition"]) == (0.0, True, "max_turns_reached")
    finally:
        env.close()


def test_tool_env_offers_its_tools_and_runs_the_calls(vf_site):
    from astraflow.tools.calls import ToolCall

    row = _rows("vf_tiny_calc")[0]
    env = _make("verifiers:vf_tiny_calc", max_turns=3)
    try:
        _obs, info = env.reset(options={"task": row})
        (tool,) = info["tools"]
        assert tool["function"]["name"] == "calculator"
        assert tool["function"]["parameters"]["required"] == ["expression"]
        call = ToolCall("calculator", {"expression": row["question"]})
        obs, reward, terminated, _t, info = env.step([call])
        assert obs == row["answer"] and (reward, terminated) == (0.0, False)
        assert info["tool_messages"] == [
            {"role": "tool", "content": row["answer"], "tool_call_id": call.id}
        ]
        _obs, reward, terminated, _t, info = env.step(row["answer"])
        assert (reward, terminated) == (1.0, True)
        assert info["metrics"]["calculator_calls"] == 1.0
    finally:
        env.close()


def test_our_turn_limit_truncates_and_close_ends_the_rollout(vf_site):
    row = _rows("vf_tiny_retry")[0]
    env = _make("verifiers:vf_tiny_retry", max_turns=1)
    env.reset(options={"task": row})
    _obs, reward, terminated, truncated, info = env.step("wrong")
    assert (reward, terminated, truncated, info["success"]) == (0.0, False, True, False)
    rollout = env._rollout
    env.close()
    assert rollout.cancelled()


def test_envs_check_passes_on_each_kind(vf_site):
    from astraflow.cli.envs import check_one

    for name in MODULES:
        row = check_one(f"verifiers:{name}", {"max_turns": 3}, 2, 0, 40)
        assert row["ok"], row.get("traceback")


def test_loading_keeps_the_services_signal_handlers(vf_site):
    """verifiers' Environment installs SIGINT/SIGTERM handlers when built; a node builds envs in
    pool threads (where that raises) and owns Ctrl-C, so the adapter keeps them out."""
    from astraflow.envs.ecosystems.verifiers_env import load

    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    errors: list[BaseException] = []

    def build():
        try:
            load("vf_tiny_arith", {"num_train": 3})
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    worker = threading.Thread(target=build)
    worker.start()
    worker.join()
    assert errors == []
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before


def test_missing_environment_names_what_to_install(vf_site):
    from astraflow.envs.ecosystems.verifiers_env import VerifiersError

    with pytest.raises(VerifiersError, match="vf_not_installed.*must be installed"):
        _make("verifiers:vf_not_installed")


# `astraflow eval run` on these environments (single-turn, multi-turn, tool env):
# tests/e2e/test_eval_ecosystems.py
