"""One training timeline per policy, whatever crashed: exact resume from a trainer checkpoint.

A trainer that restarts resumes from its newest checkpoint, which may be older than the steps the
service already acknowledged (it checkpoints every ``trainer.checkpoint_every`` steps). Without
care the run then ends short: the service's step count went on while the weights went back. So:

* The service keeps the samples of every acknowledged step after the trainer's newest checkpoint
  (the trainer reports it in each :class:`~astraflow.protocol.BatchAck`), and frees them once a
  checkpoint covers their step.
* When the trainer announces a version older than the acknowledged steps, the policy *rewinds*:
  the batches of the later steps become unacknowledged again and are served in their original
  order, so the restarted trainer retrains on exactly the same batches (on the CPU, to the same
  weights bit for bit; elsewhere to the same within float non-determinism). Their step and
  evaluation records leave ``metrics.jsonl``, pending evaluations of the versions being retrained
  are cancelled, and the trainer requests them again when it reaches those versions. A batch whose
  samples were freed anyway (the checkpoint it relied on was deleted) cannot be replayed: it is
  marked ``rewound`` and its step is trained on fresh groups instead.

The result: after any crash and restart the run ends with exactly ``run.max_steps`` steps,
version == step, each batch trained once in the final timeline.
"""

from __future__ import annotations

import json

from astraflow.dataflow import storage
from astraflow.dataflow.ops import state
from astraflow.dataflow.ops.context import Context
from astraflow.dataflow.storage.store import Tx


def _freed_key(policy: str) -> str:
    return f"freed_through:{policy}"


def on_ack(ctx: Context, tx: Tx, policy: str, batch_id: str, checkpoint: int | None) -> None:
    """After ``batch_id`` was acknowledged: free the samples no restart can need any more."""
    if checkpoint is None:  # the trainer cannot resume: nothing will be served again
        groups = storage.groups.ids_of_batch(tx, batch_id)
        storage.samples.discard_token_arrays(tx, groups)
        return
    freed = int(tx.get_meta(_freed_key(policy)) or 0)
    if checkpoint <= freed:
        return
    groups = storage.groups.of_acked_steps(tx, policy, freed, checkpoint)
    storage.samples.discard_token_arrays(tx, groups)
    tx.set_meta(_freed_key(policy), str(checkpoint))


def rewind(ctx: Context, tx: Tx, policy: str, version: int) -> int:
    """``policy``'s trainer restarted at ``version``: undo the acknowledged steps after it.

    Returns how many steps were undone (0 when the announcement is not a rewind)."""
    later = storage.batches.acked_after(tx, policy, version)
    if not later:
        return 0
    freed = int(tx.get_meta(_freed_key(policy)) or 0)
    for batch_id, step, summary in later:
        replayable = step > freed
        storage.batches.unack(tx, batch_id, "served" if replayable else "rewound")
        hist = json.loads(summary)["staleness"]
        storage.staleness.subtract(tx, [(n, policy, int(k)) for k, n in hist.items()])
    tx.set_meta(_freed_key(policy), str(min(freed, version)))
    tx.delete_meta("training_done_at")
    _cancel_evaluations(tx, policy, version, ctx.now())
    ctx.metrics.forget(
        tx,
        lambda r: (
            r.get("policy") == policy
            and r.get("type") in ("step", "eval")
            and int(r.get("version") or 0) > version
        ),
    )
    storage.tallies.drops.add(tx, policy, "rewound_steps", len(later))
    return len(later)


def reannounced(ctx: Context, tx: Tx, policy: str, version: int, digest: str) -> None:
    """``version`` announced again: with other weights than before (a retrained step that was
    not bit-identical), its evaluations measured weights that no longer exist: drop them."""
    announced = storage.versions.digest(tx, policy, version)
    if announced is None or announced == digest:
        return
    _cancel_evaluations(tx, policy, version - 1, ctx.now())
    ctx.metrics.forget(
        tx,
        lambda r: (
            r.get("policy") == policy
            and r.get("type") == "eval"
            and int(r.get("version") or 0) >= version
        ),
    )


def _cancel_evaluations(tx: Tx, policy: str, version: int, now: float) -> None:
    """Evaluations of versions after ``version`` measured (or would measure) weights this timeline
    no longer has: drop them, their open tasks, and the idempotency keys that would answer the
    trainer's request for the retrained version with the old result."""
    for eval_id in storage.evaluations.ids_after(tx, policy, version):
        storage.tasks.cancel_evaluation(tx, eval_id, now)
        storage.evaluations.delete(tx, eval_id)
        storage.idempotency.forget_evaluation(tx, state.pack(eval_id))
