"""``astraflow/Code-v0`` and ``astraflow/CodeMultiTurn-v0`` through a real sandbox."""

from __future__ import annotations

import pytest
from astraflow.envs.base import TaskError
from astraflow.envs.code.env import SAMPLE_TASKS, CodeEnv, CodeMultiTurnEnv
from astraflow.envs.code.extract import assemble, extract_code
from astraflow.envs.code.harness import plan_tests
from astraflow.envs.registry import default_registry
from gymnasium.utils.env_checker import check_env

TASK = {
    "id": "t/fizz",
    "prompt": 'def fizz(n: int) -> str:\n    """"Fizz" for multiples of 3, else str(n)."""\n',
    "entry_point": "fizz",
    "tests": (
        "import math\n\n"
        "def check(candidate):\n"
        "    assert candidate(3) == 'Fizz'\n"
        "    assert candidate(4) == '4'\n"
        "    assert True, 'this is not a test'\n"
        "    value = candidate(9)\n"
        "    assert value == 'Fizz'\n"
        "    for i in (1, 2):\n"
        "        assert candidate(i) == str(i)\n"
    ),
    "canonical_solution": "    return 'Fizz' if n % 3 == 0 else str(n)\n",
}


def reply(code: str) -> str:
    return f"Here you go:\n```python\n{code}\n```\nDone."


@pytest.fixture(scope="module")
def env():
    e = CodeEnv()
    yield e
    e.close()


def test_registered_and_checkable():
    reg = default_registry()
    for env_id, cls in (
        ("astraflow/Code-v0", CodeEnv),
        ("astraflow/CodeMultiTurn-v0", CodeMultiTurnEnv),
    ):
        made = reg.make(env_id)
        assert isinstance(made, cls)
        check_env(made, skip_render_check=True)


def test_plan_splits_asserts_and_skips_trivial_ones():
    plan = plan_tests(TASK["tests"])
    assert plan.n_tests == 4  # 3 asserts + 1 loop; `assert True` and the assignment are setup
    assert "import math" in plan.prelude
    assert plan_tests(["assert f(1) == 1", "x = 2"]).n_tests == 1
    with pytest.raises(ValueError, match="not valid Python"):
        plan_tests("def check(:")


def test_extract_and_assemble():
    assert extract_code("no code here") is None
    assert extract_code("```\nprint(1)\n```\n```python\nprint(2)\n```") == "print(2)\n"
    assert extract_code("```python\nprint(3)") == "print(3)"  # unterminated last block
    program, mode = assemble(TASK["prompt"], "def fizz(n):\n    return 'x'\n", "fizz")
    assert mode == "full" and program.startswith(TASK["prompt"].rstrip())
    program, mode = assemble(TASK["prompt"], TASK["canonical_solution"], "fizz")
    assert mode == "completion" and program == TASK["prompt"] + TASK["canonical_solution"]


def test_canonical_passes_all(env):
    obs, info = env.reset(options={"task": TASK})
    assert "def fizz" in obs and "```python" in obs and info["n_tests"] == 4
    obs, reward, terminated, truncated, info = env.step(
        reply(TASK["prompt"] + TASK["canonical_solution"])
    )
    assert reward == 1.0 and terminated and not truncated and info["success"]
    assert info["passed"] == 4 and all(t["passed"] for t in info["tests"])
    assert info["sandbox"]["backend"] in ("docker", "bwrap", "process")


def test_body_only_completion_passes(env):
    env.reset(options={"task": TASK})
    _, reward, *_ = env.step(reply(TASK["canonical_solution"]))
    assert reward == 1.0


def test_partial_solution_gets_the_pass_fraction(env):
    env.reset(options={"task": TASK})
    # right for multiples of 3 only: passes the two Fizz asserts, fails '4' and the loop
    _, reward, _, _, info = env.step(reply("def fizz(n):\n    return 'Fizz'\n"))
    assert reward == pytest.approx(0.5)
    failed = [t for t in info["tests"] if not t["passed"]]
    assert len(failed) == 2 and failed[0]["error"].startswith("AssertionError")
    assert not info["success"]


def test_wrong_and_broken_code_score_zero(env):
    env.reset(options={"task": TASK})
    _, reward, _, _, info = env.step(reply("def fizz(n):\n    return None\n"))
    assert reward == 0.0
    env.reset(options={"task": TASK})
    _, reward, _, _, info = env.step(reply("def fizz(n) return"))
    assert reward == 0.0 and "SyntaxError" in info["error"]
    env.reset(options={"task": TASK})
    _, reward, _, _, info = env.step("I cannot solve this.")
    assert reward == 0.0 and "no ```python code block" in info["error"]


def test_hanging_test_times_out_alone():
    env = CodeEnv(test_timeout_s=1.0, timeout_s=20.0)
    env.reset(options={"task": TASK})
    code = "def fizz(n):\n    while n == 4:\n        pass\n    return 'Fizz' if n % 3 == 0 else str(n)\n"
    _, reward, _, _, info = env.step(reply(code))
    assert reward == pytest.approx(0.75)  # only the candidate(4) test hangs
    timed = [t for t in info["tests"] if not t["passed"]]
    assert len(timed) == 1 and "timeout" in timed[0]["error"]


@pytest.mark.slow
def test_program_killed_by_wall_clock_counts_unrun_tests_as_failed():
    env = CodeEnv(timeout_s=3.0, test_timeout_s=10.0)
    env.reset(options={"task": TASK})
    code = "import signal\nsignal.signal(signal.SIGALRM, signal.SIG_IGN)\ndef fizz(n):\n    while True:\n        pass\n"
    _, reward, _, _, info = env.step(reply(code))
    assert reward == 0.0
    assert info["sandbox"]["killed_reason"] == "timeout" and info["sandbox"]["timed_out"]
    assert "stopped early" in info["error"]


def test_solution_that_exits_does_not_fake_success(env):
    env.reset(options={"task": TASK})
    _, reward, _, _, info = env.step(reply("import os\ndef fizz(n):\n    os._exit(0)\n"))
    assert reward == 0.0 and info["tests"]
    assert not any(t["passed"] for t in info["tests"])
    assert "solution process exited" in info["tests"][0]["error"], info["tests"]


def test_bad_task_payload_is_a_clear_error(env):
    with pytest.raises(TaskError, match="missing 'tests'"):
        env.reset(options={"task": {"id": "x", "prompt": "", "entry_point": "f"}})
    with pytest.raises(TaskError, match="'tests' must be a str or a list of str"):
        env.reset(options={"task": {**TASK, "tests": 3}})


def test_multi_turn_feedback_then_success():
    env = CodeMultiTurnEnv(max_turns=3)
    env.reset(options={"task": TASK})
    obs, reward, terminated, truncated, info = env.step(reply("def fizz(n):\n    return 'Fizz'\n"))
    assert reward == 0.0 and not terminated and not truncated
    assert "passed 2 of 4 tests" in obs and "FAILED: assert candidate(4) == '4'" in obs
    obs, reward, terminated, truncated, info = env.step(
        reply(TASK["prompt"] + TASK["canonical_solution"])
    )
    assert reward == 1.0 and terminated and info["success"]


def test_multi_turn_truncates_with_last_pass_fraction():
    env = CodeMultiTurnEnv(max_turns=2)
    env.reset(options={"task": SAMPLE_TASKS[0]})
    _, r1, term, trunc, _ = env.step("no code")
    assert (r1, term, trunc) == (0.0, False, False)
    _, r2, term, trunc, info = env.step(reply("def add(a, b):\n    return 3\n"))
    assert r2 == pytest.approx(0.5) and not term and trunc and not info["success"]


def test_unfenced_replies_short_prompt_and_capped_feedback():
    from astraflow.tasks.code import generated

    task = generated("train", seed=0, n=1)[0]
    env = CodeMultiTurnEnv(max_turns=2, fence="optional", instruction="{prompt}", feedback_chars=40)
    obs, _ = env.reset(options={"task": task})
    assert obs == task["prompt"] and obs.endswith("return ")
    obs, reward, terminated, _, info = env.step("0")  # run as the rest of the function
    assert reward == 0.0 and not terminated and info["sandbox"] and len(obs) == 40
    _, reward, terminated, _, info = env.step(task["canonical_solution"])
    assert reward == 1.0 and terminated and info["assembly"] == "completion"
    env.close()
    strict = CodeEnv(instruction="Code:\n{prompt}")
    strict.reset(options={"task": task})
    assert strict.step(task["canonical_solution"])[4]["error"].startswith("no ```python")
    for bad in ({"fence": "maybe"}, {"instruction": "no slot"}, {"feedback_chars": 0}):
        with pytest.raises(ValueError):
            CodeEnv(**bad)
