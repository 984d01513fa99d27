"""A multi-turn verifiers environment: a wrong answer gets one more try (MultiTurnEnv)."""

import verifiers as vf
from vf_tiny_arith import correct, problems


class RetryEnv(vf.MultiTurnEnv):
    async def env_response(self, messages, state, **kwargs):
        return [vf.UserMessage(content=f"Not quite. Again: {state['prompt'][-1].content}")]

    @vf.stop
    async def solved(self, state) -> bool:
        if not state["trajectory"]:
            return False
        answer = self.parser.parse_answer(state["trajectory"][-1]["completion"]) or ""
        return answer.strip() == state["answer"]


def load_environment(max_turns: int = 2, **kwargs) -> vf.Environment:
    rubric = vf.Rubric(funcs=[correct], weights=[1.0])
    return RetryEnv(
        dataset=problems(64, 0), eval_dataset=problems(16, 1), rubric=rubric,
        max_turns=max_turns, **kwargs,
    )  # fmt: skip
