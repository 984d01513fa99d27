"""`astraflow report RUN_DIR`: plots and a markdown summary from a run's ``metrics.jsonl``."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path


def read_metrics(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: is {run_dir} a run directory?")
    records = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if line:
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a line cut by a crash; the rest is still useful
    return records


def _throughput(records: list[dict], window: int = 10) -> dict[str, tuple[list, list]]:
    """Trained samples per second over a sliding window of steps, from the step records' times."""
    out: dict[str, tuple[list, list]] = defaultdict(lambda: ([], []))
    by_policy: dict[str, list[dict]] = defaultdict(list)
    for r in records:
        if r.get("type") == "step" and "time" in r:
            by_policy[r.get("policy", "policy")].append(r)
    for policy, recs in by_policy.items():
        for i in range(window, len(recs)):
            span = recs[i]["time"] - recs[i - window]["time"]
            if span > 0:
                n = sum(int(r.get("samples", 0)) for r in recs[i - window + 1 : i + 1])
                out[policy][0].append(recs[i].get("step", i))
                out[policy][1].append(n / span)
    return dict(out)


def _series(records: list[dict], kind: str, key: str) -> dict[str, tuple[list, list]]:
    if key == "samples_per_s":
        return _throughput(records)
    out: dict[str, tuple[list, list]] = defaultdict(lambda: ([], []))
    for r in records:
        if r.get("type") != kind:
            continue
        val = r.get(key, (r.get("metrics") or {}).get(key))
        if val is None:
            continue
        xs, ys = out[r.get("policy", "policy")]
        xs.append(r.get("step", len(xs)))
        ys.append(val)
    return dict(out)


def write_report(run_dir: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run_dir = Path(run_dir)
    records = read_metrics(run_dir)
    out = run_dir / "report"
    out.mkdir(exist_ok=True)
    panels = [
        ("reward", "step", "reward_mean", "mean reward (train groups)"),
        ("eval_accuracy", "eval", "accuracy", "held-out accuracy (greedy)"),
        ("throughput", "step", "samples_per_s", "trained samples / s"),
        ("staleness", "step", "staleness_mean", "mean staleness (versions)"),
    ]
    fig, axes = plt.subplots(2, 2, figsize=(10, 7))
    for ax, (_, kind, key, title) in zip(axes.flat, panels, strict=True):
        for policy, (xs, ys) in _series(records, kind, key).items():
            ax.plot(xs, ys, marker="o" if kind == "eval" else None, label=policy)
        ax.set_title(title)
        ax.set_xlabel("trainer step")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend()
    fig.tight_layout()
    fig.savefig(out / "overview.png", dpi=110)
    plt.close(fig)

    lines = [f"# Run report: {run_dir.name}", ""]
    evals = _series(records, "eval", "accuracy")
    rewards = _series(records, "step", "reward_mean")
    lines += [
        "| policy | steps | first reward | last reward | first eval | last eval |",
        "|---|---|---|---|---|---|",
    ]
    for policy in sorted(set(evals) | set(rewards)):
        rx, ry = rewards.get(policy, ([], []))
        ex, ey = evals.get(policy, ([], []))
        f = lambda v: f"{v:.3f}" if isinstance(v, (int, float)) else "-"  # noqa: E731
        lines.append(
            f"| {policy} | {rx[-1] if rx else 0} | {f(ry[0] if ry else None)} | {f(ry[-1] if ry else None)}"
            f" | {f(ey[0] if ey else None)} | {f(ey[-1] if ey else None)} |"
        )
    lines += ["", "![overview](overview.png)", ""]
    (out / "summary.md").write_text("\n".join(lines))
    return out
