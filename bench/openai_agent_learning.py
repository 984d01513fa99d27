"""Does an agent written only with the ``openai`` SDK learn like the quickstart? Side by side.

Two runs of ``astraflow train recipes/quickstart.toml``, same seed and settings: the built-in
``single_agent`` workflow (the quickstart as shipped) and ``workflow.name = "openai_agent"`` with
``tests/rollout/openai_agents/arith_agent.py:solve`` (one SDK chat call, the reply scored by the
Math env), which reaches the policy through the rollout node's recording endpoint over HTTP. Both
read their held-out greedy accuracy (arith test split) from the run's own evaluations.

    python bench/openai_agent_learning.py [--quick] [--json PATH] [--seed N]

``--quick`` trains 60 steps per run and evaluates on 200 held-out problems (~2-3 min per run).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import console, fmt, table, write_json  # noqa: E402
from _runs import REPO_ROOT, run_recipe  # noqa: E402

RECIPE = REPO_ROOT / "recipes" / "quickstart.toml"
AGENT = REPO_ROOT / "tests" / "rollout" / "openai_agents" / "arith_agent.py"
ARMS = {
    "single_agent (quickstart)": [],
    "openai_agent (SDK agent)": [
        "workflow.name=openai_agent",
        f"workflow.agent={json.dumps(f'{AGENT}:solve')}",
    ],
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="60 steps, 200 held-out problems")
    ap.add_argument("--json", type=Path, help="write the figures here")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=1200.0, help="seconds per run")
    args = ap.parse_args(argv)
    common = []
    if args.quick:
        common = ["run.max_steps=60", "evaluation.every_steps=30", "evaluation.num_tasks=200"]
    rows, figures = [], {}
    with tempfile.TemporaryDirectory(prefix="af-openai-agent-") as tmp:
        for i, (arm, extra) in enumerate(ARMS.items()):
            res = run_recipe(RECIPE, [*common, *extra], system=f"arm{i}", seed=args.seed,
                             workdir=Path(tmp), timeout_s=args.timeout)  # fmt: skip
            if not res.ok:
                console.print(f"[red]{arm} failed:[/] {res.error}")
                return 1
            pol = res.policies["policy"]
            before, after = pol.accuracy_before, pol.accuracy_final
            gain = (after - before) * 100 if before is not None and after is not None else None
            rows.append([
                arm, str(pol.steps), str(pol.trained_samples), fmt(before, "{:.3f}"),
                fmt(after, "{:.3f}"), fmt(pol.accuracy_best, "{:.3f}"), fmt(gain, "{:+.1f}"),
                fmt(res.wall_s, "{:.0f}", " s"),
            ])  # fmt: skip
            figures[arm] = {
                "acc_before": before, "acc_after": after, "acc_best": pol.accuracy_best,
                "gain_points": gain, "steps": pol.steps, "trained_samples": pol.trained_samples,
                "wall_s": res.wall_s,
                "evals": [{"step": p.step, "accuracy": p.accuracy} for p in pol.evals],
            }  # fmt: skip
    console.print(table(
        "held-out greedy accuracy (arith test split), same recipe and seed",
        ["workflow", "steps", "trained samples", "acc_before", "acc_after", "acc_best",
         "gain (points)", "wall"], rows,
    ))  # fmt: skip
    if args.json:
        write_json(args.json, {"seed": args.seed, "quick": args.quick, "arms": figures})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
