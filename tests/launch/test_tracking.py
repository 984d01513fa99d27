"""Experiment tracking: metrics.jsonl forwarded to TensorBoard and W&B (offline), read back.

`astraflow train` writing TensorBoard scalars is checked on the shared quickstart run:
tests/e2e/test_quickstart_run.py::test_train_writes_tensorboard_scalars."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from astraflow.launch.tracking import TensorBoardBackend, Tracker, WandbBackend, scalars

ROOT = Path(__file__).resolve().parents[2]

STEP = {
    "seq": 1, "type": "step", "policy": "solver", "step": 3, "version": 3, "samples": 16,
    "groups": 2, "reward_mean": 0.5, "staleness_mean": 0.25, "staleness_max": 1,
    "dropped": {"stale": 2}, "drops_total": {"zero_variance": 7, "stale": 2},
    "metrics": {"loss": 0.1, "time/publish_s": 0.02},
    "nodes": {"node-0": {"tokens_per_s": 900.0, "weight_sync_s": 0.05}}, "time": 1000.0,
}  # fmt: skip
EVAL = {"seq": 2, "type": "eval", "policy": "solver", "version": 3, "step": 3,
        "task_set": "arith", "split": "test", "accuracy": 0.4, "n": 10, "errors": 0,
        "time": 1001.0}  # fmt: skip


def _scalars_tb(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return {t: [(e.step, e.value) for e in acc.Scalars(t)] for t in acc.Tags()["scalars"]}


def test_scalars_flatten_every_field():
    axis, step, values = scalars(STEP)
    assert (axis, step) == ("solver", 3)
    assert values == {
        "solver/version": 3.0, "solver/samples": 16.0, "solver/groups": 2.0,
        "solver/reward_mean": 0.5, "solver/staleness_mean": 0.25, "solver/staleness_max": 1.0,
        "solver/dropped_batch/stale": 2.0, "solver/dropped_total/zero_variance": 7.0,
        "solver/dropped_total/stale": 2.0, "solver/train/loss": 0.1,
        "solver/train/time/publish_s": 0.02, "solver/nodes/node-0/tokens_per_s": 900.0,
        "solver/nodes/node-0/weight_sync_s": 0.05,
    }  # fmt: skip
    assert scalars(EVAL)[2] == {
        "solver/eval/arith/test/accuracy": 0.4, "solver/eval/arith/test/n": 10.0,
        "solver/eval/arith/test/errors": 0.0, "solver/eval/arith/test/version": 3.0,
    }  # fmt: skip
    assert scalars({"seq": 9, "type": "restart", "count": 2, "name": "x"}) == (
        "restart",
        9,
        {"restart/count": 2.0},
    )
    assert scalars({"seq": 1, "type": "step", "policy": "p", "step": 1, "note": "x"}) is None


def test_tracker_forwards_once_across_rewrites_and_resumes(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text(json.dumps(STEP) + "\n" + json.dumps(EVAL)[:20])  # a half-written line
    tracker = Tracker(tmp_path, [TensorBoardBackend(tmp_path / "tb")])
    assert tracker.poll() == 1
    with metrics.open("w") as f:  # the rest of the line arrives
        f.write(json.dumps(STEP) + "\n" + json.dumps(EVAL) + "\n")
    assert tracker.poll() == 1
    # a rewound timeline rewrites the file (new inode) with the kept records and a new one
    tmp = tmp_path / "m.tmp"
    later = {**STEP, "seq": 3, "step": 4, "reward_mean": 0.75}
    tmp.write_text("".join(json.dumps(r) + "\n" for r in (STEP, EVAL, later)))
    os.replace(tmp, metrics)
    assert tracker.poll() == 1
    tracker.close()
    # a resumed run's tracker starts from the saved seq: nothing is sent twice
    again = Tracker(tmp_path, [TensorBoardBackend(tmp_path / "tb")])
    assert again.poll() == 0
    again.close()
    got = _scalars_tb(tmp_path / "tb")
    assert got["solver/reward_mean"] == [(3, 0.5), (4, 0.75)]
    assert got["solver/eval/arith/test/accuracy"] == [(3, pytest.approx(0.4))]
    assert got["solver/nodes/node-0/tokens_per_s"] == [(3, 900.0), (4, 900.0)]


def _wandb_history(path: Path) -> list[dict]:
    """History rows of an offline ``.wandb`` file: a 7-byte file header, then LevelDB-log
    records (7-byte header: crc, length, type FULL/FIRST/MIDDLE/LAST) in 32 KiB blocks, each a
    ``wandb_internal_pb2.Record``. This wandb version has no Python reader of its own."""
    import struct

    from wandb.proto import wandb_internal_pb2

    raw, pos, part, rows = path.read_bytes(), 7, b"", []
    assert raw[:4] == b":W&B"
    while pos + 7 <= len(raw):
        left = 32768 - pos % 32768
        if left < 7:
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", raw[pos : pos + 7])
        data, pos = raw[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind in (1, 4):
            rec = wandb_internal_pb2.Record()
            rec.ParseFromString(part + data if kind == 4 else data)
            if rec.WhichOneof("record_type") == "history":
                items = rec.history.item
                rows.append(
                    {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in items}
                )
        part = data if kind == 2 else part + data if kind == 3 else b""
    return rows


@pytest.mark.slow
def test_wandb_offline_receives_every_scalar(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_SILENT", "true")
    (tmp_path / "metrics.jsonl").write_text(json.dumps(STEP) + "\n" + json.dumps(EVAL) + "\n")
    backend = WandbBackend(tmp_path, "t", "astraflow-test", None, "offline", {"a": 1})
    tracker = Tracker(tmp_path, [backend])
    assert tracker.poll() == 2
    tracker.close()
    (run_file,) = (tmp_path / "wandb").glob("offline-run-*/*.wandb")
    step_row, eval_row = _wandb_history(run_file)
    _, _, expected = scalars(STEP)
    assert {k: v for k, v in step_row.items() if not k.startswith("_")} == {
        **expected,
        "solver/step": 3,
    }
    assert eval_row["solver/eval/arith/test/accuracy"] == 0.4 and eval_row["solver/step"] == 3


def test_recipe_backends_are_checked_and_a_missing_extra_is_named(tmp_path, monkeypatch):
    from astraflow.launch.tracking import TrackerUnavailable, open_tracker
    from astraflow.recipe import RecipeError, load_recipe

    quick = ROOT / "recipes" / "quickstart.toml"
    with pytest.raises(RecipeError, match="logging.backends"):
        load_recipe(quick, ['logging.backends=["mlflow"]'])
    assert open_tracker(load_recipe(quick, []), tmp_path) is None
    monkeypatch.setitem(sys.modules, "tensorboardX", None)  # as if the extra were not installed
    recipe = load_recipe(quick, ['logging.backends=["tensorboard"]'])
    with pytest.raises(TrackerUnavailable, match=r"pip install 'astraflow\[tensorboard\]'"):
        open_tracker(recipe, tmp_path)
