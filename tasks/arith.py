"""Generated arithmetic: small integer problems sized for RL on a CPU with the tiny built-in policy.

Train and test splits come from disjoint seeds and are de-duplicated against each other, so held-out
accuracy measures generalisation rather than memorisation.
"""

from __future__ import annotations

import random
from typing import Any

#: (operator, min operand, max operand) per difficulty level.
LEVELS: dict[int, list[tuple[str, int, int]]] = {
    1: [("+", 0, 9), ("-", 0, 9)],
    2: [("+", 0, 99), ("-", 0, 99), ("*", 0, 9)],
    3: [("+", 0, 999), ("-", 0, 999), ("*", 0, 99)],
    # beyond the tiny policy for a long while: two-digit by two-digit products (the "cannot yet
    # solve" share of a mixed-difficulty set; bench/data_algorithms.py)
    4: [("*", 10, 99)],
}
SPLIT_SIZES = {"train": 20_000, "test": 500}
TEST_SIZE_CAP = {1: 50}
_SPLIT_SEEDS = {"train": 1_000_003, "test": 7_777_777}


def problem(rng: random.Random, level: int) -> dict[str, Any]:
    op, lo, hi = rng.choice(LEVELS[level])
    a, b = rng.randint(lo, hi), rng.randint(lo, hi)
    if op == "*" and level in (2, 3):
        b = rng.randint(0, 9)
    answer = {"+": a + b, "-": a - b, "*": a * b}[op]
    return {"question": f"{a}{op}{b}", "answer": str(answer), "level": level}


def generate(
    split: str = "train", seed: int = 0, size: int | None = None, level: int = 2, **_: Any
) -> list[dict[str, Any]]:
    """Deterministic problems for ``split``; ``seed`` shifts the train stream, never the test set."""
    if level not in LEVELS:
        raise ValueError(f"arith level must be one of {sorted(LEVELS)}, got {level}")
    n = size if size is not None else SPLIT_SIZES[split]
    test_rng = random.Random(_SPLIT_SEEDS["test"] + level)
    test = []
    seen_test = set()
    # level 1 has only ~200 distinct problems: hold out a quarter of them, not 500
    n_test = min(SPLIT_SIZES["test"], TEST_SIZE_CAP.get(level, SPLIT_SIZES["test"]))
    while len(test) < n_test:
        p = problem(test_rng, level)
        if p["question"] not in seen_test:
            seen_test.add(p["question"])
            test.append(p)
    if split == "test":
        items = test[:n]
    else:
        rng = random.Random(_SPLIT_SEEDS["train"] + 31 * seed + level)
        items = []
        while len(items) < n:
            p = problem(rng, level)
            if p["question"] not in seen_test:
                items.append(p)
    for i, p in enumerate(items):
        p["id"] = f"arith-L{level}-{split}-{i}"
    return items
