"""A benchmark's figures (matplotlib, headless); a failed plot is reported, never raised."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from _report import console
from _results import RunResult


def plot_safely(draw: Callable[[], Path | None]) -> Path | None:
    """``draw()``, reporting the plot's path; a failure is reported, never raised: the numbers
    matter more than the picture."""
    try:
        path = draw()
    except Exception as exc:  # noqa: BLE001 - see the docstring
        console.print(f"[yellow]plot failed: {exc}[/]")
        return None
    if path:
        console.print(f"plot: {path}")
    return path


def save_figure(fig, path: Path) -> Path:
    """Lay out, write (PNG, folders created) and close a matplotlib figure."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_accuracy(
    runs: Sequence[RunResult], path: Path, colours: dict[str, str], title: str, xlabel: str,
    symlog: bool = False, policies: Sequence[str] = ("policy",), **line: Any,
) -> Path | None:  # fmt: skip
    """Held-out accuracy of each of ``policies`` against training time (one panel per policy),
    one line per successful run, one colour (and legend entry) per system; None when no run has
    an evaluation."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(policies), figsize=(8 * len(policies), 4.5), squeeze=False)
    drawn = False
    for ax, policy in zip(axes[0], policies, strict=True):
        labelled: set[str] = set()
        for r in runs:
            p = r.policies.get(policy)
            if not r.ok or p is None or not p.evals:
                continue
            label = None if r.system in labelled else r.system
            labelled.add(r.system)
            ax.plot([e.t for e in p.evals], [e.accuracy for e in p.evals], color=colours[r.system],
                    alpha=0.75, lw=1.2, label=label, **line)  # fmt: skip
        if not labelled:
            continue
        drawn = True
        if symlog:
            ax.set_xscale("symlog", linthresh=10)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("held-out greedy accuracy")
        ax.set_title(title if len(policies) == 1 else f"{title}: {policy}")
        ax.grid(alpha=0.3)
        ax.legend()
    if not drawn:
        plt.close(fig)
        return None
    return save_figure(fig, path)
