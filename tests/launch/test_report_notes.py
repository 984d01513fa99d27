"""`astraflow report` explains a blank panel instead of leaving it empty (samples/s needs more
steps than its sliding window)."""

from __future__ import annotations

import json

from astraflow.launch.report import THROUGHPUT_WINDOW, write_report


def test_short_run_says_why_samples_per_s_is_blank(tmp_path):
    steps = [
        {"type": "step", "policy": "policy", "step": i, "time": float(i), "samples": 8,
         "reward_mean": 0.1 * i, "staleness_mean": 0.0}
        for i in range(1, 4)
    ]  # fmt: skip
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in steps))
    out = write_report(tmp_path)
    summary = (out / "summary.md").read_text()
    assert (out / "overview.png").stat().st_size > 0
    assert "Empty panels:" in summary
    assert (
        f"throughput: samples/s is a sliding window of {THROUGHPUT_WINDOW} steps: it needs more "
        f"than {THROUGHPUT_WINDOW} steps; this run has 3" in summary
    )
    assert "eval_accuracy: no evaluation ran" in summary
    assert "reward:" not in summary.split("Empty panels:")[1]  # that panel has data

    longer = [dict(steps[0], step=i, time=float(i)) for i in range(1, THROUGHPUT_WINDOW + 3)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in longer))
    assert "throughput:" not in (write_report(tmp_path) / "summary.md").read_text()
