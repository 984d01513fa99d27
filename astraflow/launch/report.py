"""`astraflow report RUN_DIR`: plots and a markdown summary from a run's ``metrics.jsonl``."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

#: steps in the samples/s panel's sliding window (a shorter run leaves that panel blank)
THROUGHPUT_WINDOW = 10


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


def _throughput(
    records: list[dict], window: int = THROUGHPUT_WINDOW
) -> dict[str, tuple[list, list]]:
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


def metric_series(records: list[dict], kind: str, key: str) -> dict[str, tuple[list, list]]:
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


def _blank(records: list[dict]) -> set[str]:
    """Panels with nothing to plot."""
    out = set()
    for name, kind, key in (("reward", "step", "reward_mean"), ("eval_accuracy", "eval", "accuracy"),
                            ("throughput", "step", "samples_per_s"),
                            ("staleness", "step", "staleness_mean")):  # fmt: skip
        if not any(xs for xs, _ in metric_series(records, kind, key).values()):
            out.add(name)
    return out


def empty_panel_notes(records: list[dict]) -> dict[str, str]:
    """Why each panel may be blank, in the words the report prints on it."""
    steps = sum(1 for r in records if r.get("type") == "step")
    return {
        "reward": "no training steps recorded yet",
        "eval_accuracy": "no evaluation ran (evaluation.every_steps = 0, or none finished yet)",
        "throughput": f"samples/s is a sliding window of {THROUGHPUT_WINDOW} steps: it needs more "
        f"than {THROUGHPUT_WINDOW} steps; this run has {steps}",
        "staleness": "no acknowledged batch reported staleness",
    }


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
    notes = empty_panel_notes(records)
    fig, axes = plt.subplots(2, 2, figsize=(10, 7))
    for ax, (name, kind, key, title) in zip(axes.flat, panels, strict=True):
        series = metric_series(records, kind, key)
        for policy, (xs, ys) in series.items():
            ax.plot(xs, ys, marker="o" if kind == "eval" else None, label=policy)
        if not any(xs for xs, _ in series.values()):  # say why the panel is blank
            ax.text(0.5, 0.5, notes.get(name, "no data in metrics.jsonl"), ha="center",
                    va="center", wrap=True, transform=ax.transAxes, color="0.4")  # fmt: skip
        ax.set_title(title)
        ax.set_xlabel("trainer step")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend()
    fig.tight_layout()
    fig.savefig(out / "overview.png", dpi=110)
    plt.close(fig)

    lines = [f"# Run report: {run_dir.name}", ""]
    evals = metric_series(records, "eval", "accuracy")
    rewards = metric_series(records, "step", "reward_mean")
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
    blank = [f"- {name}: {note}" for name, note in notes.items() if name in _blank(records)]
    if blank:
        lines += ["", "Empty panels:", *blank]
    lines += ["", "![overview](overview.png)", ""]
    (out / "summary.md").write_text("\n".join(lines))
    return out
