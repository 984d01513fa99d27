"""Math environments: one answer (``astraflow/Math-v0``) or several tries with feedback
(``astraflow/MathMultiTurn-v0``)."""

from __future__ import annotations

from typing import Any, ClassVar

from astraflow.envs.base import StateMixin, TaskError, TextEnv
from astraflow.envs.math.answer import answers_match, extract_answer

#: Sample tasks for checks and demos: plain arithmetic plus answers that need symbolic grading.
_SYMBOLIC_SAMPLES = (
    {"question": "What is 1/2 + 1/4? Give the answer as a fraction.", "answer": "\\frac{3}{4}"},
    {"question": "Simplify (x^2 - 1)/(x - 1).", "answer": "x+1"},
    {"question": "What is the square root of 50?", "answer": "5\\sqrt{2}"},
)


def _text_field(task: dict[str, Any], name: str, env_name: str) -> str:
    value = task.get(name)
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise TaskError(
            f"{env_name}: task field {name!r} must be a string (or a number), "
            f"got {type(value).__name__}: {value!r:.80}"
        )
    value = str(value)
    if not value.strip():
        raise TaskError(f"{env_name}: task field {name!r} is empty")
    return value


class MathEnv(StateMixin, TextEnv):
    """A math problem answered once; correctness checked symbolically with math-verify.

    Saves its state between turns (``state_dict``: the task, the turn; the gold answer is
    re-derived from the task), so a multi-turn episode resumes on another node."""

    family: ClassVar[str] = "math"
    description: ClassVar[str] = "Math problem, one answer, graded with math-verify"
    action_format: ClassVar[str] = (
        "Free text ending with the answer, marked by (in order of precedence) \\boxed{...}, "
        "'Answer: X', '#### X', or a bare final number/expression on the last line "
        "(e.g. '36'); otherwise the last number in the text is taken."
    )
    reward_doc: ClassVar[str] = (
        "1.0 if the extracted answer equals the gold answer (exact decimal comparison when both are "
        "plain numbers, math-verify symbolic equivalence otherwise), else 0.0; plus `format_reward` "
        "(kwarg, default 0) when the answer is in \\boxed{...}. info: correct, extracted, style, "
        "format_ok, reward_correct, reward_format, success."
    )
    task_fields: ClassVar[dict[str, str]] = {
        "question": "problem text, shown as is (str)",
        "answer": "gold answer: number or LaTeX expression (str)",
        "id": "optional task id",
        "level": "optional difficulty level",
    }

    def __init__(
        self,
        max_turns: int = 1,
        format_reward: float = 0.0,
        instruction: str | None = None,
        prompt_template: str | None = None,
        render_mode: str | None = None,
    ):
        """``instruction`` is appended to the question after a blank line (e.g. "Put your final
        answer in \\boxed{}."); ``prompt_template`` replaces the whole first observation and must
        contain ``{question}``. Arithmetic sets need neither: the question is shown as is."""
        super().__init__(max_turns=max_turns, render_mode=render_mode)
        if prompt_template is not None and "{question}" not in prompt_template:
            raise ValueError(
                f"prompt_template must contain '{{question}}', got {prompt_template!r:.120}"
            )
        if format_reward < 0:
            raise ValueError(f"format_reward must be >= 0, got {format_reward}")
        self.format_reward = float(format_reward)
        self.instruction = instruction
        self.prompt_template = prompt_template
        self._gold = ""

    # --- task handling -----------------------------------------------------------------------
    def sample_task(self, rng) -> dict[str, Any]:
        pick = int(rng.integers(0, 4))
        if pick < len(_SYMBOLIC_SAMPLES) and rng.random() < 0.3:
            return dict(_SYMBOLIC_SAMPLES[pick], id=f"sample-symbolic-{pick}")
        a, b = int(rng.integers(0, 100)), int(rng.integers(0, 100))
        op = "+-*"[int(rng.integers(0, 3))]
        value = {"+": a + b, "-": a - b, "*": a * b}[op]
        return {"id": f"sample-{a}{op}{b}", "question": f"{a}{op}{b}", "answer": str(value)}

    def validate_task(self, task: dict[str, Any]) -> None:
        super().validate_task(task)
        name = type(self).__name__
        _text_field(task, "question", name)
        _text_field(task, "answer", name)

    def first_observation(self, question: str) -> str:
        if self.prompt_template is not None:
            return self.prompt_template.replace("{question}", question)
        if self.instruction:
            return f"{question}\n\n{self.instruction}"
        return question

    def _reset_task(self, task: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        self._gold = str(task["answer"]).strip()
        info = {"task_id": task.get("id")}
        return self.first_observation(str(task["question"])), info

    # --- stepping ----------------------------------------------------------------------------
    def grade(self, action: str) -> tuple[float, dict[str, Any]]:
        """Reward and score breakdown of one answer."""
        extraction = extract_answer(action)
        correct = answers_match(self._gold, extraction.answer)
        format_ok = extraction.style == "boxed"
        reward_format = self.format_reward if format_ok else 0.0
        reward_correct = 1.0 if correct else 0.0
        info = {
            "correct": correct,
            "extracted": extraction.answer,
            "style": extraction.style,
            "format_ok": format_ok,
            "reward_correct": reward_correct,
            "reward_format": reward_format,
        }
        return reward_correct + reward_format, info

    def _step_text(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        reward, info = self.grade(action)
        info["success"] = info["correct"]
        info["turn"] = self.turn
        return "", reward, True, info


class MathMultiTurnEnv(MathEnv):
    """A math problem with up to ``max_turns`` tries; a wrong answer gets feedback and another go."""

    description: ClassVar[str] = "Math problem, several tries with 'incorrect, try again' feedback"
    reward_doc: ClassVar[str] = (
        "Per turn: 1.0 when the answer is correct (the episode ends), else 0.0 with the feedback "
        "observation; plus `format_reward` (kwarg, default 0) for a \\boxed{...} answer. After "
        "`max_turns` wrong answers the episode is truncated with success False. info as Math-v0, "
        "plus turn."
    )

    def __init__(
        self,
        max_turns: int = 3,
        format_reward: float = 0.0,
        instruction: str | None = None,
        prompt_template: str | None = None,
        feedback: str = "Your answer is incorrect, try again.",
        render_mode: str | None = None,
    ):
        super().__init__(
            max_turns=max_turns,
            format_reward=format_reward,
            instruction=instruction,
            prompt_template=prompt_template,
            render_mode=render_mode,
        )
        self.feedback = feedback

    def _step_text(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        reward, info = self.grade(action)
        info["turn"] = self.turn
        if info["correct"]:
            info["success"] = True
            return "", reward, True, info
        return self.feedback, reward, False, info
