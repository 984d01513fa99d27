"""``astraflow train recipes/quickstart.toml`` with ``--set`` overrides, as the slow training tests
run it: a real run in a subprocess, then its metrics and its dataflow store to read (through the dataflow's
storage functions: no SQL outside ``astraflow/dataflow/storage/``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from astraflow.dataflow.storage import history, store

T = TypeVar("T")

ROOT = Path(__file__).resolve().parents[2]
#: two small steps: 2 groups of 4 episodes each, no periodic evaluation
TWO_SMALL_STEPS = [
    "run.max_steps=2",
    "tasks.group_size=4",
    "policies.policy.trainer.groups_per_step=2",
    "rollout.concurrency=8",
    "evaluation.every_steps=0",
]


@dataclass
class QuickstartRun:
    records: list[dict]
    run_dir: Path
    #: what ``astraflow train`` printed (its final lines name the run's end)
    stdout: str = ""

    @property
    def step_versions(self) -> list[int]:
        return [r["version"] for r in self.records if r.get("type") == "step"]

    def read(self, read: Callable[[store.Tx], T]) -> T:
        """``read(tx)`` on the finished run's store (e.g. ``history.samples``)."""
        with store.read_only(self.run_dir / "dataflow.db") as tx:
            return read(tx)

    def episodes(self) -> list[tuple[str, dict]]:
        """``(finish_reason, info)`` of every episode the run stored; a failed episode's info
        gains its ``error`` message, so an assertion on it shows why it failed."""
        return [
            (e.finish_reason, {**e.info, **({"error": e.error} if e.error else {})})
            for e in self.read(history.episodes)
        ]


def train_quickstart(
    tmp_path: Path, sets: list[str], env: dict[str, str] | None = None, timeout: int = 900
) -> QuickstartRun:
    argv = [
        sys.executable,
        "-m",
        "astraflow.cli.main",
        "train",
        "recipes/quickstart.toml",
        "--no-live",
    ]
    for s in [*sets, f"run.output_dir={json.dumps(str(tmp_path))}"]:
        argv += ["--set", s]
    environ = {**os.environ, "COLUMNS": "200", **(env or {})}
    proc = subprocess.run(
        argv, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=environ
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    run_dir = tmp_path / "quickstart"
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return QuickstartRun([json.loads(x) for x in lines if x], run_dir, proc.stdout)
