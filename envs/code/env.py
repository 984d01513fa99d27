"""``astraflow/Code-v0`` and ``astraflow/CodeMultiTurn-v0``: write a function, pass its tests.

The model's reply must contain a fenced ```python block (``fence="required"``, the default); with
``fence="optional"`` a reply without one is taken whole as the code (completion style, e.g. a small
model continuing the prompt's function body). The code (assembled with the task prompt) and the
task's tests run in ONE sandbox run (see :mod:`astraflow.envs.code.harness`); the reward is the
fraction of tests passed. The multi-turn variant answers a failed attempt with the failing tests and
their errors and lets the model try again, up to ``max_turns``.

Small-context models: ``instruction`` replaces the text shown around the task prompt (a format
string with ``{prompt}``; ``"{prompt}"`` shows the bare function to complete) and ``feedback_chars``
caps the multi-turn feedback message.
"""

from __future__ import annotations

from typing import Any, ClassVar

from astraflow.envs.base import StateMixin, TaskError, TextEnv
from astraflow.envs.code.extract import assemble, extract_code
from astraflow.envs.code.harness import build_program, parse_report, plan_tests

INSTRUCTION = (
    "Complete the following Python function. Reply with the complete function (including the "
    "def line) in a single ```python code block.\n\n```python\n{prompt}```"
)
FEEDBACK_LIMIT = 6
FENCES = ("required", "optional")
SAMPLE_TASKS = (
    {
        "id": "sample/add",
        "prompt": 'def add(a: int, b: int) -> int:\n    """Return the sum of a and b."""\n',
        "entry_point": "add",
        "tests": "def check(candidate):\n    assert candidate(1, 2) == 3\n    assert candidate(-1, 1) == 0\n",
        "canonical_solution": "    return a + b\n",
    },
    {
        "id": "sample/reverse",
        "prompt": 'def reverse(s: str) -> str:\n    """Return s reversed."""\n',
        "entry_point": "reverse",
        "tests": "def check(candidate):\n    assert candidate('abc') == 'cba'\n    assert candidate('') == ''\n",
        "canonical_solution": "    return s[::-1]\n",
    },
)


class CodeEnv(StateMixin, TextEnv):
    """Single-turn code generation scored by unit tests in a sandbox."""

    family: ClassVar[str] = "code"
    description: ClassVar[str] = (
        "Write a Python function; it runs against the task's tests in a sandbox."
    )
    action_format: ClassVar[str] = (
        "A reply containing one fenced ```python code block (the last one is used)."
    )
    reward_doc: ClassVar[str] = (
        "Fraction of the task's tests that pass (each assert of check() is one test); 0 when the "
        "reply has no code block or the code does not load."
    )
    task_fields: ClassVar[dict[str, str]] = {
        "id": "stable task id",
        "prompt": "function signature and docstring shown to the model (may be empty)",
        "entry_point": "name of the function under test",
        "tests": "test source: a check(candidate) function, top-level asserts, or a list of statements",
        "canonical_solution": "optional reference body (not shown to the model)",
    }

    def __init__(
        self,
        sandbox: str | None = "auto",
        max_turns: int = 1,
        timeout_s: float = 30.0,
        test_timeout_s: float = 10.0,
        memory_mb: int = 512,
        render_mode: str | None = None,
        fence: str = "required",
        instruction: str | None = None,
        feedback_chars: int | None = None,
    ):
        super().__init__(max_turns=max_turns, render_mode=render_mode)
        if fence not in FENCES:
            raise ValueError(f"{type(self).__name__}: fence must be one of {FENCES}, got {fence!r}")
        if instruction is not None and "{prompt}" not in instruction:
            raise ValueError(
                f"{type(self).__name__}: instruction must contain '{{prompt}}', got {instruction!r}"
            )
        if feedback_chars is not None and feedback_chars < 1:
            raise ValueError(
                f"{type(self).__name__}: feedback_chars must be >= 1 or None, got {feedback_chars}"
            )
        self.fence = fence
        self.instruction = INSTRUCTION if instruction is None else instruction
        self.feedback_chars = feedback_chars
        self.sandbox_choice = sandbox
        self.timeout_s = timeout_s
        self.test_timeout_s = test_timeout_s
        self.memory_mb = memory_mb
        self._sandbox = None
        self._plan = None
        self._closed = False

    # --- sandbox --------------------------------------------------------------------------------
    @property
    def sandbox(self):
        """The backend, chosen on first use (Docker probing costs time; resets never need it)."""
        if self._closed:
            # A step still running when the env was closed (a rollout node kills an env call that
            # ran past rollout.env_timeout_s) must not start a fresh sandbox behind the kill.
            from astraflow.envs.sandbox import SandboxError

            raise SandboxError(f"{type(self).__name__} was closed; reset it to use it again")
        if self._sandbox is None:
            from astraflow.envs.sandbox import select_backend

            choice = self.sandbox_choice
            self._sandbox = select_backend(None if choice in (None, "auto") else choice)
        return self._sandbox

    def close(self) -> None:
        """Release the sandbox; safe to call from another thread while ``step`` runs: the running
        program is killed (``killed_reason="closed"``) and that ``step`` returns at once."""
        self._closed = True
        box, self._sandbox = self._sandbox, None
        if box is not None:
            box.close()
        super().close()

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        self._closed = False
        return super().reset(seed=seed, options=options)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The task and turn (the test plan is re-derived from the task; the sandbox is chosen
        afresh on first use, and each attempt runs as a program of its own, so no sandbox state
        is saved)."""
        self._closed = False
        super().load_state_dict(state)

    # --- TextEnv --------------------------------------------------------------------------------
    def sample_task(self, rng) -> dict[str, Any]:
        return dict(SAMPLE_TASKS[int(rng.integers(len(SAMPLE_TASKS)))])

    def validate_task(self, task: dict[str, Any]) -> None:
        super().validate_task(task)
        tests = task["tests"]
        if not isinstance(tests, (str, list)) or (
            isinstance(tests, list) and not all(isinstance(t, str) for t in tests)
        ):
            raise TaskError(
                f"{type(self).__name__}: task 'tests' must be a str or a list of str, "
                f"got {type(tests).__name__}"
            )
        for key in ("prompt", "entry_point"):
            if not isinstance(task[key], str):
                raise TaskError(
                    f"{type(self).__name__}: task {key!r} must be a str, got {type(task[key]).__name__}"
                )
        try:
            plan_tests(tests)
        except ValueError as exc:
            raise TaskError(f"{type(self).__name__}: task {task.get('id')!r}: {exc}") from exc

    def _reset_task(self, task: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        self._plan = plan_tests(task["tests"])
        return self.instruction.replace("{prompt}", task["prompt"]), {
            "task_id": task["id"],
            "n_tests": self._plan.n_tests,
        }

    def evaluate(self, action: str) -> dict[str, Any]:
        """Run the reply's code against the task's tests; the info dict of one attempt."""
        from astraflow.envs.sandbox import Limits

        code = extract_code(action)
        if code is None and self.fence == "optional" and action.strip():
            code = action
        if code is None:
            return {
                "pass_fraction": 0.0,
                "error": "no ```python code block in the reply",
                "tests": [],
                "n_tests": self._plan.n_tests,
                "passed": 0,
            }
        program, mode = assemble(self.task["prompt"], code, self.task["entry_point"])
        harness, nonce = build_program(
            program,
            self._plan,
            self.task["entry_point"],
            test_timeout_s=self.test_timeout_s,
            load_timeout_s=self.test_timeout_s,
        )
        result = self.sandbox.run(
            harness, limits=Limits(wall_time_s=self.timeout_s, memory_mb=self.memory_mb)
        )
        report = parse_report(result.stdout, nonce, self._plan)
        error = report.load_error
        if error is None and not report.finished:
            error = f"the program stopped early ({result.killed_reason or f'exit code {result.exit_code}'})"
        return {
            "pass_fraction": report.pass_fraction,
            "passed": report.passed,
            "n_tests": report.n_tests,
            "tests": report.results,
            "error": error,
            "setup_errors": report.setup_errors,
            "assembly": mode,
            "sandbox": result.summary(),
            "stderr_tail": result.stderr[-2000:],
        }

    def _step_text(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        info = self.evaluate(action)
        info["task_id"] = self.task["id"]
        info["success"] = info["pass_fraction"] == 1.0
        return "", info["pass_fraction"], True, info


class CodeMultiTurnEnv(CodeEnv):
    """Like Code-v0, but a failed attempt gets the failing tests back and may try again."""

    description: ClassVar[str] = (
        "Write a Python function; failing tests are fed back for another try."
    )
    reward_doc: ClassVar[str] = (
        "0 on intermediate turns; on the last turn (all tests pass, or max_turns reached) the "
        "fraction of tests passed by that attempt, so an episode's return is its final pass fraction."
    )

    def __init__(self, max_turns: int = 3, **kwargs: Any):
        super().__init__(max_turns=max_turns, **kwargs)

    def _step_text(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        info = self.evaluate(action)
        info["task_id"] = self.task["id"]
        info["success"] = info["pass_fraction"] == 1.0
        last = info["success"] or self.turn >= self.max_turns
        if last:
            return "", info["pass_fraction"], info["success"], info
        text = self.feedback(info)
        if self.feedback_chars is not None:
            text = text[: self.feedback_chars]
        return text, 0.0, False, info

    @staticmethod
    def feedback(info: dict[str, Any]) -> str:
        lines = [f"Your code passed {info['passed']} of {info['n_tests']} tests."]
        if info.get("error"):
            lines.append(f"Error: {info['error']}")
        failing = [t for t in info["tests"] if not t["passed"]]
        for t in failing[:FEEDBACK_LIMIT]:
            lines.append(f"FAILED: {t['test']}\n  -> {t['error']}")
        if len(failing) > FEEDBACK_LIMIT:
            lines.append(f"... and {len(failing) - FEEDBACK_LIMIT} more failing tests.")
        tail = info.get("stderr_tail", "").strip()
        if tail and not info.get("tests"):
            lines.append("stderr:\n" + tail[-800:])
        lines.append(
            "Fix the function and reply with the complete corrected code in a ```python block."
        )
        return "\n".join(lines)
