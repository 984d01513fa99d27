"""A single-turn verifiers environment: small sums, the answer checked exactly by its rubric."""

import random

import verifiers as vf
from datasets import Dataset


def problems(n: int, seed: int) -> Dataset:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b = rng.randint(0, 99), rng.randint(0, 99)
        rows.append({"question": f"{a}+{b}", "answer": str(a + b)})
    return Dataset.from_list(rows)


def correct(completion, answer, parser) -> float:
    return 1.0 if (parser.parse_answer(completion) or "").strip() == answer else 0.0


def load_environment(num_train: int = 64, num_eval: int = 16, **kwargs) -> vf.Environment:
    rubric = vf.Rubric(funcs=[correct], weights=[1.0])
    return vf.SingleTurnEnv(
        dataset=problems(num_train, 0), eval_dataset=problems(num_eval, 1), rubric=rubric, **kwargs
    )
