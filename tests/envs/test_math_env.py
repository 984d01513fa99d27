"""Math envs: answer extraction, symbolic grading with math-verify, the numeric fast path, rewards
and feedback over whole episodes, and clear errors for bad payloads."""

from __future__ import annotations

import subprocess
import sys

import pytest
from astraflow.envs.base import TaskError
from astraflow.envs.math.answer import answers_match, extract_answer, plain_number
from astraflow.envs.registry import default_registry


@pytest.fixture(scope="module")
def registry():
    return default_registry()


@pytest.mark.parametrize(
    ("text", "answer", "style"),
    [
        ("36", "36", "bare"),
        ("-7\n", "-7", "bare"),
        ("We get x = 2, so \\boxed{\\frac{1}{2}}.", "\\frac{1}{2}", "boxed"),
        ("first \\boxed{1} then \\boxed{\\sqrt{\\frac{a}{b}}}", "\\sqrt{\\frac{a}{b}}", "boxed"),
        ("Work...\nAnswer: 0.5.", "0.5", "answer"),
        ("So the final answer is $\\frac{3}{4}$.", "\\frac{3}{4}", "answer"),
        ("She pays 3*6=18.\n#### 1,000", "1,000", "hashes"),
        ("She makes 9 * 2 = 18 dollars every day at the market.", "18", "last_number"),
        ("no numbers here at all, sorry about that", None, "none"),
        ("", None, "none"),
    ],
)
def test_extraction(text, answer, style):
    got = extract_answer(text)
    assert (got.answer, got.style) == (answer, style)


@pytest.mark.parametrize(
    ("gold", "pred"),
    [
        ("1/2", "0.5"),
        ("\\frac{1}{2}", "0.5"),
        ("0.5", "\\frac{1}{2}"),
        ("\\frac{1}{2}", "1/2"),
        ("x+1", "1+x"),
        ("5\\sqrt{2}", "\\sqrt{50}"),
        ("\\left( 3, \\frac{\\pi}{2} \\right)", "(3, \\pi/2)"),
        ("36", "36.0"),
        ("1000", "1,000"),
        ("18", "$18"),
    ],
)
def test_equivalent_answers_match(gold, pred):
    assert answers_match(gold, pred)


@pytest.mark.parametrize(
    ("gold", "pred"),
    [
        ("1/2", "0.25"),
        ("\\frac{1}{2}", "2"),
        ("x+1", "x-1"),
        ("36", "37"),
        ("36", None),
        ("36", "  "),
    ],
)
def test_different_answers_do_not_match(gold, pred):
    assert not answers_match(gold, pred)


def test_plain_numbers_are_graded_without_math_verify():
    """The fast path: integer/decimal answers never import math-verify (nor sympy)."""
    code = (
        "import sys\n"
        "from astraflow.envs.math.answer import answers_match\n"
        "assert answers_match('36', '36') and answers_match('-2.50', '-2.5')\n"
        "assert not answers_match('1,234', '1235')\n"
        "print('math_verify' in sys.modules, 'sympy' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "False"]
    assert plain_number("1,234.5") == plain_number("1234.50")
    assert plain_number("\\frac{1}{2}") is None


def test_single_turn_episode(registry):
    env = registry.make("astraflow/Math-v0")
    obs, info = env.reset(
        seed=0, options={"task": {"id": "t1", "question": "47-11", "answer": "36"}}
    )
    assert obs == "47-11"  # shown as is: workflows apply the chat template
    assert info["task_id"] == "t1"
    obs, reward, terminated, truncated, info = env.step("36")
    assert (reward, terminated, truncated, info["success"]) == (1.0, True, False, True)
    assert info["extracted"] == "36" and info["reward_correct"] == 1.0
    env.reset(options={"task": {"question": "47-11", "answer": "36"}})
    _, reward, terminated, _, info = env.step("35")
    assert (reward, terminated, info["success"]) == (0.0, True, False)


def test_format_reward_and_instruction(registry):
    env = registry.make(
        "astraflow/Math-v0", format_reward=0.1, instruction="Put your final answer in \\boxed{}."
    )
    obs, _ = env.reset(
        options={"task": {"question": "What is half of one?", "answer": "\\frac{1}{2}"}}
    )
    assert obs == "What is half of one?\n\nPut your final answer in \\boxed{}."
    _, reward, _, _, info = env.step("It is \\boxed{0.5}")
    assert reward == pytest.approx(1.1)
    assert info["format_ok"] and info["reward_format"] == pytest.approx(0.1)
    env.reset(options={"task": {"question": "What is half of one?", "answer": "\\frac{1}{2}"}})
    _, reward, _, _, info = env.step("Answer: 1/2")
    assert reward == 1.0 and not info["format_ok"]
    templated = registry.make("astraflow/Math-v0", prompt_template="Q: {question}\nA:")
    obs, _ = templated.reset(options={"task": {"question": "2+2", "answer": "4"}})
    assert obs == "Q: 2+2\nA:"
    with pytest.raises(ValueError, match="prompt_template must contain"):
        registry.make("astraflow/Math-v0", prompt_template="no placeholder")


def test_multi_turn_feedback_then_success(registry):
    env = registry.make("astraflow/MathMultiTurn-v0", max_turns=3)
    env.reset(options={"task": {"question": "6*7", "answer": "42"}})
    obs, reward, terminated, truncated, info = env.step("41")
    assert "incorrect, try again" in obs
    assert (reward, terminated, truncated, info["correct"]) == (0.0, False, False, False)
    obs, reward, terminated, truncated, info = env.step("\\boxed{42}")
    assert (reward, terminated, truncated, info["success"], info["turn"]) == (
        1.0,
        True,
        False,
        True,
        2,
    )


def test_multi_turn_truncates_after_max_turns(registry):
    env = registry.make("astraflow/MathMultiTurn-v0", max_turns=2)
    env.reset(options={"task": {"question": "6*7", "answer": "42"}})
    assert env.step("1")[3] is False
    _, reward, terminated, truncated, info = env.step("2")
    assert (reward, terminated, truncated, info["success"]) == (0.0, False, True, False)


@pytest.mark.parametrize(
    ("task", "message"),
    [
        ({"answer": "1"}, "missing 'question'"),
        ({"question": "1+1"}, "missing 'answer'"),
        ({"question": "1+1", "answer": ["2"]}, "'answer' must be a string"),
        ({"question": "   ", "answer": "2"}, "'question' is empty"),
    ],
)
def test_bad_payloads_name_the_field(registry, task, message):
    env = registry.make("astraflow/Math-v0")
    with pytest.raises(TaskError, match=message):
        env.reset(options={"task": task})


def test_unknown_kwarg_is_named(registry):
    with pytest.raises(TypeError, match="does not accept kwargs.*accepted: max_turns"):
        registry.make("astraflow/Math-v0", max_turn=2)


def test_symbolic_grading_works_off_the_main_thread():
    """Rollout nodes step envs in worker threads, where math-verify's SIGALRM timeout is illegal."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(2) as pool:
        results = list(
            pool.map(lambda pair: answers_match(*pair), [("1/2", "0.5"), ("x+1", "1+x")])
        )
    assert results == [True, True]


def test_symbolic_grading_is_bounded_in_a_worker_thread(monkeypatch):
    """Off the main thread math-verify's SIGALRM timeout is unusable, so grading is bounded by our
    watchdog: a comparison that sympy would work on for seconds is cut at SYMBOLIC_TIMEOUT_S and
    counts as wrong, and the same thread grades correctly afterwards (nothing left pending)."""
    import threading
    import time
    from concurrent.futures import ThreadPoolExecutor

    from astraflow.envs.math import answer

    monkeypatch.setattr(answer, "SYMBOLIC_TIMEOUT_S", 0.3)

    def grade_slow_then_fast():
        assert threading.current_thread() is not threading.main_thread()
        t0 = time.perf_counter()
        slow = answer.answers_match("(x+y+z)^{25}", "(x+y+z+1)^{25}")  # seconds of sympy
        took = time.perf_counter() - t0
        return slow, took, answer.answers_match("1/2", "0.5"), answer.answers_match("x+1", "1+x")

    with ThreadPoolExecutor(1) as pool:
        slow, took, half, commuted = pool.submit(grade_slow_then_fast).result(timeout=60)
    assert slow is False
    # three bounded math-verify calls (two parses, one verify) at 0.3 s each, plus slack
    assert took < 2.0, f"grading in a worker thread was not cut: {took:.2f}s"
    assert (half, commuted) == (True, True)


def test_watchdog_fires_again_when_its_first_delivery_is_swallowed():
    """An asynchronous exception that lands in a weakref callback or ``__del__`` is printed as
    "Exception ignored" and lost (seen in CI: sympy then ran for 6 s past a 0.3 s bound); the
    watchdog must fire again until the guarded block has exited."""
    import threading
    import time
    from concurrent.futures import ThreadPoolExecutor

    from astraflow.envs.math import answer

    class Cut(BaseException):
        pass

    def spin(seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            pass

    def guarded() -> tuple[bool, bool, float]:
        assert threading.current_thread() is not threading.main_thread()
        swallowed = cut = False
        t0 = time.perf_counter()
        try:
            with answer._Watchdog(0.1, Cut, refire_s=0.02):
                try:
                    spin(10)
                except Cut:
                    swallowed = True  # what an "Exception ignored" does to the first delivery
                spin(10)
        except Cut:
            cut = True
        return swallowed, cut, time.perf_counter() - t0

    with ThreadPoolExecutor(1) as pool:
        swallowed, cut, took = pool.submit(guarded).result(timeout=60)
    assert swallowed and cut
    assert took < 5.0, f"the second delivery never came: the block ran {took:.1f}s"
