"""Speed of the math and search envs' hot paths (run: python bench/env_speed.py [--quick]).

Measures why the math grader has a numeric fast path (math-verify per call vs direct decimal
comparison), and what a search turn costs (BM25 over the stdlib corpus).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import _stamp
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _per_call(fn, items, repeat: int) -> float:
    """Median seconds per call over ``repeat`` passes through ``items``."""
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for item in items:
            fn(*item)
        times.append((time.perf_counter() - t0) / len(items))
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="fewer items and passes (< 1 min)")
    ap.add_argument("--json", type=Path, help="write the results as JSON here")
    args = ap.parse_args()
    n, repeat = (200, 3) if args.quick else (2000, 5)

    from astraflow.envs.math.answer import answers_match, symbolic_equal
    from astraflow.envs.registry import default_registry
    from astraflow.envs.search.corpus import load_corpus_jsonl
    from astraflow.envs.search.index import SearchIndex
    from astraflow.envs.search.stdlib_corpus import ensure_stdlib_set, stdlib_questions

    ints = [(str(i * 7), str(i * 7 if i % 2 else i * 7 + 1)) for i in range(n)]
    latex = [("\\frac{1}{2}", "0.5"), ("x+1", "1+x"), ("5\\sqrt{2}", "\\sqrt{50}")] * (n // 30 + 1)
    symbolic_equal("1", "1")  # import math-verify and sympy outside the timings
    rows = {
        "math: integers, fast path (answers_match)": _per_call(answers_match, ints, repeat),
        "math: integers, math-verify (symbolic_equal)": _per_call(
            symbolic_equal, ints[: n // 10], repeat
        ),
        "math: LaTeX, math-verify (answers_match)": _per_call(answers_match, latex, repeat),
    }
    env = default_registry().make("astraflow/Math-v0")
    tasks = [{"question": f"{i}+1", "answer": str(i + 1)} for i in range(n)]

    def episode(task):
        env.reset(options={"task": task})
        env.step(task["answer"])

    rows["math: Math-v0 reset+step, integer answer"] = _per_call(
        episode, [(t,) for t in tasks], repeat
    )

    t0 = time.perf_counter()
    paths = ensure_stdlib_set()
    passages = load_corpus_jsonl(paths.corpus_path)
    t1 = time.perf_counter()
    index = SearchIndex(passages)
    rows[f"search: build BM25 index ({len(passages)} passages)"] = time.perf_counter() - t1
    rows["search: load/generate stdlib corpus"] = t1 - t0
    queries = [(q["question"], 3) for q in stdlib_questions()[:n]]
    rows["search: top-3 query"] = _per_call(index.search, queries, repeat)

    table = Table(title=f"env hot paths ({'quick' if args.quick else 'full'})")
    table.add_column("what")
    table.add_column("seconds per call", justify="right")
    table.add_column("calls/s", justify="right")
    for name, seconds in rows.items():
        table.add_row(name, f"{seconds:.2e}", f"{1 / seconds:,.0f}" if seconds > 0 else "-")
    Console().print(table)
    if args.json:
        _stamp.write_json(args.json, {"seconds_per_call": rows})


if __name__ == "__main__":
    main()
