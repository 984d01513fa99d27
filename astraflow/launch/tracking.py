"""Experiment tracking: every record of ``metrics.jsonl`` forwarded to TensorBoard and/or W&B.

Why one tracker in the launcher, following the file: ``metrics.jsonl`` is already the run's one
durable record (written by the dataflow service alone, in commit order, with a ``seq`` per line),
so the services stay unaware of trackers, a tracker failure cannot stop training, and a run
directory can be re-sent to a tracker later. What the file holds reaches every backend:

* ``step`` records (one per optimizer step and policy): reward, samples, groups, the weight
  version, staleness mean/max, the batch's drops and all drops so far by reason, the trainer's
  metrics (loss, clip ratio, publish time ...), and each rollout node's throughput and weight-sync
  times (``nodes``), logged at the policy's step;
* ``eval`` records: accuracy, n and errors per task set and split, at the step they evaluated;
* any other record type: its numeric fields under ``TYPE/...``.

Tags are ``POLICY/...`` so policies advancing at their own pace each get their own x axis (in W&B
through ``define_metric(POLICY/*, step_metric=POLICY/step)``). The last forwarded ``seq`` is kept
in ``run_dir/tracking.json``: a resumed run, or a file rewritten after a rewound timeline, sends
nothing twice.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

from astraflow.errors import AstraFlowError

log = logging.getLogger("astraflow.launch.tracking")

STATE_FILE = "tracking.json"


class JsonlFollower:
    """New complete lines of a JSONL file at each :meth:`poll`; a file replaced by another (a
    rewritten ``metrics.jsonl``) is read from its start again (``rewritten`` is then True)."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.offset = 0
        self.inode: int | None = None

    def poll(self) -> tuple[bool, list[dict]]:
        rewritten = False
        try:
            with open(self.path, "rb") as f:
                inode = os.fstat(f.fileno()).st_ino
                if inode != self.inode:
                    rewritten = self.inode is not None
                    self.inode, self.offset = inode, 0
                f.seek(self.offset)
                chunk = f.read()
        except OSError:
            return False, []
        end = chunk.rfind(b"\n") + 1
        self.offset += end
        records = []
        for line in chunk[:end].splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if isinstance(rec, dict):
                records.append(rec)
        return rewritten, records


def _number(v: Any) -> float | None:
    if isinstance(v, bool):
        return float(v)
    if isinstance(v, (int, float)) and v == v:  # not NaN
        return float(v)
    return None


def _flat(prefix: str, value: Any) -> Iterator[tuple[str, float]]:
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _flat(f"{prefix}/{k}", v)
    else:
        num = _number(value)
        if num is not None:
            yield prefix, num


STEP_FIELDS = ("version", "samples", "groups", "reward_mean", "staleness_mean", "staleness_max")


def scalars(record: dict) -> tuple[str, int, dict[str, float]] | None:
    """``(axis, step, {tag: value})`` of one metrics record; None when it carries no number.

    ``axis`` is the prefix every tag starts with (the policy, or the record type), whose
    ``AXIS/step`` tag is the x axis in W&B."""
    kind = record.get("type")
    if kind == "step":
        axis = str(record.get("policy", "policy"))
        out = {f"{axis}/{k}": n for k in STEP_FIELDS if (n := _number(record.get(k))) is not None}
        for group, tag in (
            ("dropped", "dropped_batch"),
            ("drops_total", "dropped_total"),
            ("metrics", "train"),
            ("nodes", "nodes"),
        ):
            out.update(_flat(f"{axis}/{tag}", record.get(group) or {}))
    elif kind == "eval":
        axis = str(record.get("policy", "policy"))
        where = f"{axis}/eval/{record.get('task_set', 'eval')}/{record.get('split', 'test')}"
        out = {
            f"{where}/{k}": n
            for k in ("accuracy", "n", "errors", "version")
            if (n := _number(record.get(k))) is not None
        }
    else:
        axis = str(kind or "record")
        skip = {"seq", "time", "step", "type"}
        out = dict(_flat(axis, {k: v for k, v in record.items() if k not in skip}))
    if not out:
        return None
    step = record.get("step")
    step = int(step) if isinstance(step, (int, float)) else int(record.get("seq", 0))
    return axis, step, out


class Backend(Protocol):
    def log(
        self, axis: str, step: int, values: dict[str, float], walltime: float | None
    ) -> None: ...

    def close(self) -> None: ...


class TensorBoardBackend:
    """Scalars in ``run_dir/tensorboard`` (tensorboardX: no TensorFlow or torch import)."""

    def __init__(self, log_dir: Path):
        try:
            from tensorboardX import SummaryWriter
        except ImportError as exc:
            raise TrackerUnavailable(
                "logging.backends has 'tensorboard' but tensorboardX is not installed: "
                "pip install 'astraflow[tensorboard]'"
            ) from exc
        import secrets

        self.log_dir = Path(log_dir)
        # event files are named by the second they were opened: a resumed run's writer opened in
        # the same second would replace the first file, so each writer gets a suffix of its own
        self.writer = SummaryWriter(
            logdir=str(self.log_dir), flush_secs=5, filename_suffix=f".{secrets.token_hex(4)}"
        )

    def log(self, axis: str, step: int, values: dict[str, float], walltime: float | None) -> None:
        for tag, v in values.items():
            self.writer.add_scalar(tag, v, global_step=step, walltime=walltime)

    def flush(self) -> None:
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbBackend:
    """A W&B run (offline by default: ``run_dir/wandb``, upload later with ``wandb sync``)."""

    def __init__(self, run_dir: Path, name: str, project: str, entity: str | None, mode: str,
                 config: dict[str, Any] | None = None):  # fmt: skip
        try:
            import wandb
        except ImportError as exc:
            raise TrackerUnavailable(
                "logging.backends has 'wandb' but wandb is not installed: "
                "pip install 'astraflow[wandb]'"
            ) from exc
        self.wandb = wandb
        self.run = wandb.init(
            project=project,
            entity=entity,
            name=name,
            dir=str(run_dir),
            mode=mode,
            config=config or {},
            id=_wandb_id(run_dir),
            resume="allow",
            settings=wandb.Settings(silent=True, console="off"),
        )
        self._axes: set[str] = set()

    def log(self, axis: str, step: int, values: dict[str, float], walltime: float | None) -> None:
        if axis not in self._axes:
            self._axes.add(axis)
            self.run.define_metric(f"{axis}/step")
            self.run.define_metric(f"{axis}/*", step_metric=f"{axis}/step")
        self.run.log({**values, f"{axis}/step": step})

    def close(self) -> None:
        self.run.finish()
        # finish() can return before wandb's core process has written the last records of an
        # offline run; teardown waits for that process to exit (the launcher has one run)
        self.wandb.teardown()


def _wandb_id(run_dir: Path) -> str:
    """One W&B run per run directory, kept across ``--resume`` (stored beside the metrics)."""
    path = Path(run_dir) / "wandb_run_id"
    if path.is_file():
        return path.read_text().strip()
    import secrets

    run_id = secrets.token_hex(8)
    path.write_text(run_id)
    return run_id


class TrackerUnavailable(AstraFlowError, RuntimeError):
    """A backend the recipe asks for cannot start (its extra is not installed)."""


class Tracker:
    """Follows ``run_dir/metrics.jsonl`` and forwards each new record to every backend."""

    def __init__(self, run_dir: Path, backends: list[Any]):
        self.run_dir = Path(run_dir)
        self.backends = backends
        self.follower = JsonlFollower(self.run_dir / "metrics.jsonl")
        self.state_path = self.run_dir / STATE_FILE
        self.last_seq = self._load_seq()
        self.forwarded = 0

    def _load_seq(self) -> int:
        try:
            return int(json.loads(self.state_path.read_text()).get("last_seq", 0))
        except (OSError, ValueError, AttributeError):
            return 0

    def _save_seq(self) -> None:
        tmp = self.state_path.with_name(STATE_FILE + ".tmp")
        try:
            tmp.write_text(json.dumps({"last_seq": self.last_seq}))
            os.replace(tmp, self.state_path)
        except OSError as exc:  # a full disk must not stop the run; a resume may resend
            log.warning("cannot save %s: %s", self.state_path, exc)

    def poll(self) -> int:
        """Forward the records appended since the last call; returns how many."""
        _, records = self.follower.poll()
        sent = 0
        for rec in records:
            seq = int(rec.get("seq", 0) or 0)
            if seq and seq <= self.last_seq:
                continue  # already sent (a resumed run, a rewritten file)
            item = scalars(rec)
            if item is not None:
                axis, step, values = item
                for b in self.backends:
                    try:
                        b.log(axis, step, values, rec.get("time"))
                    except Exception as exc:  # a tracker problem must not stop the run
                        log.warning("tracking backend %s failed: %s", type(b).__name__, exc)
                sent += 1
            self.last_seq = max(self.last_seq, seq)
        if records:
            self._save_seq()
        self.forwarded += sent
        return sent

    def close(self) -> None:
        self.poll()
        for b in self.backends:
            try:
                b.close()
            except Exception as exc:
                log.warning("closing tracking backend %s failed: %s", type(b).__name__, exc)


def open_tracker(recipe: Any, run_dir: Path) -> Tracker | None:
    """The recipe's ``[logging] backends`` behind one tracker; None when it names none.

    Raises :class:`TrackerUnavailable` naming the extra to install when a backend's package is
    missing (before any service starts)."""
    names = list(recipe.logging.backends)
    if not names:
        return None
    backends: list[Any] = []
    try:
        for name in names:
            if name == "tensorboard":
                backends.append(TensorBoardBackend(Path(run_dir) / "tensorboard"))
            elif name == "wandb":
                lg = recipe.logging
                backends.append(
                    WandbBackend(
                        Path(run_dir),
                        recipe.run.name,
                        lg.wandb_project,
                        lg.wandb_entity,
                        lg.wandb_mode,
                        recipe.model_dump(mode="json"),
                    )  # fmt: skip
                )
    except Exception:
        for b in backends:
            b.close()
        raise
    return Tracker(Path(run_dir), backends)
