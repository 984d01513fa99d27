"""Arithmetic level 4: the not-yet-solvable share of the data-algorithms bench's mixed set."""

from __future__ import annotations

from astraflow.tasks import arith


def test_level4_is_two_digit_products_disjoint_from_its_test_split():
    train = arith.generate("train", size=300, level=4)
    test = arith.generate("test", size=100, level=4)
    for p in train + test:
        a, b = p["question"].split("*")
        assert 10 <= int(a) <= 99 and 10 <= int(b) <= 99 and p["answer"] == str(int(a) * int(b))
    assert not {p["question"] for p in train} & {p["question"] for p in test}
    assert train == arith.generate("train", size=300, level=4)  # deterministic
    # the other levels are unchanged: level 2 and 3 products keep a one-digit factor
    assert all(
        int(p["question"].split("*")[1]) <= 9
        for p in arith.generate("train", size=300, level=3)
        if "*" in p["question"]
    )
