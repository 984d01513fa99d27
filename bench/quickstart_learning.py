"""Does the quickstart learn? Held-out greedy accuracy before and after `astraflow train`.

Runs ``astraflow train recipes/quickstart.toml`` exactly as a user would (fixed seed), then reads the
run's own evaluations (greedy, on the arithmetic test split) from ``metrics.jsonl``. Target: at least
+10 points on >= 300 held-out problems in under 10 minutes on a 2-core CPU machine.

    python bench/quickstart_learning.py [--quick] [--json PATH] [--seed N] [--set KEY=VALUE]

``--set`` overrides a recipe key, as ``astraflow train --set`` does (e.g. the LoRA figure:
``--set 'policies.policy.trainer.lora={r=16, alpha=32}'``).

``--quick`` trains 60 steps on 200 held-out problems (a smoke test of the measurement, ~2 min).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import console, fmt, table, write_json  # noqa: E402
from _runs import REPO_ROOT, run_recipe  # noqa: E402

RECIPE = REPO_ROOT / "recipes" / "quickstart.toml"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="60 steps, 200 held-out problems")
    ap.add_argument("--json", type=Path, help="write the figures here")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--timeout", type=float, default=1200.0, help="seconds before the run is stopped"
    )
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="override a recipe key (repeatable)")  # fmt: skip
    args = ap.parse_args(argv)
    overrides = []
    if args.quick:
        overrides = ["run.max_steps=60", "evaluation.every_steps=30", "evaluation.num_tasks=200"]
    overrides += args.overrides
    with tempfile.TemporaryDirectory(prefix="af-quickstart-") as tmp:
        res = run_recipe(RECIPE, overrides, system="astraflow", seed=args.seed, workdir=Path(tmp),
                         timeout_s=args.timeout)  # fmt: skip
        if not res.ok:
            console.print(f"[red]run failed:[/] {res.error}")
            return 1
        pol = res.policies["policy"]
        n_eval = 200 if args.quick else _num_tasks()
        before, after, best = pol.accuracy_before, pol.accuracy_final, pol.accuracy_best
        rows = [[
            str(pol.steps), str(pol.trained_samples), str(n_eval), fmt(before, "{:.3f}"),
            fmt(after, "{:.3f}"), fmt(best, "{:.3f}"),
            fmt((after - before) * 100 if before is not None and after is not None else None, "{:+.1f}"),
            fmt(res.wall_s, "{:.0f}", " s"),
        ]]  # fmt: skip
        console.print(table("quickstart: held-out greedy accuracy (arith test split)",
                            ["steps", "trained samples", "n_eval", "acc_before", "acc_after",
                             "acc_best", "gain (points)", "wall"], rows))  # fmt: skip
        curve = "  ".join(f"v{p.step}:{p.accuracy:.3f}" for p in pol.evals)
        console.print(f"evaluations: {curve}")
        if args.json:
            write_json(args.json, {
                "acc_before": before, "acc_after": after, "acc_best": best, "n_eval": n_eval,
                "wall_s": res.wall_s, "steps": pol.steps, "trained_samples": pol.trained_samples,
                "evals": [{"step": p.step, "accuracy": p.accuracy} for p in pol.evals],
            })  # fmt: skip
    return 0


def _num_tasks() -> int:
    from astraflow.recipe import load_recipe

    return load_recipe(RECIPE).evaluation.num_tasks


if __name__ == "__main__":
    raise SystemExit(main())
