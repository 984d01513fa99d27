"""The sampled transcripts: a few finished episodes per step, kept whole for people to read.

Why: neither the run directory nor the store held anything a person could read; the only way to
see what the policy wrote was to serve it and ask. Here ingestion keeps the first
``logging.transcripts_per_step`` episodes of each weight version (and as many failed ones), token
arrays, loss mask, log-probs and versions included, in the ``transcripts`` table. It is bounded
(per step, so a long run keeps a few per version, not every episode) and cheap: the decision is
an in-memory count, and a kept episode is one insert of arrays already packed for its samples.
Readers (`astraflow transcripts`, the dashboard, the stall message) decode the tokens with the
policy's tokenizer; the service loads no model.
"""

from __future__ import annotations

import msgpack

from astraflow.dataflow import storage
from astraflow.dataflow.storage.packed import PackedArrays, unstore
from astraflow.dataflow.storage.store import Tx
from astraflow.protocol import Episode
from astraflow.protocol.transcripts import TrajectoryArrays, TranscriptRecord


class TranscriptSampler:
    """Which episodes to keep: the first ``per_step`` of each (step, failed) pair."""

    def __init__(self, per_step: int):
        self.per_step = per_step
        self._counts: dict[tuple[int, bool], int] | None = None
        #: the newest step seen: a failed episode (no tokens, so no version) counts under it
        self._latest = -1

    def offer(
        self,
        tx: Tx,
        ep: Episode,
        arrays: list[PackedArrays],
        roles: dict[str, str],
        now: float,
    ) -> None:
        """Keep ``ep`` if its step still has room (called in the push's transaction)."""
        if self.per_step <= 0:
            return
        if self._counts is None:  # resume the counts of a restarted service
            self._counts = {
                (c.step, bool(c.failed)): c.kept for c in storage.transcripts.counts(tx)
            }
            self._latest = max((s for s, _ in self._counts), default=-1)
        step = max((a.max_version for a in arrays), default=self._latest)
        self._latest = max(self._latest, step)
        key = (step, ep.error is not None)
        if self._counts.get(key, 0) >= self.per_step:
            return
        self._counts[key] = self._counts.get(key, 0) + 1
        body = {
            "policy": {t.role: roles.get(t.role, t.role) for t in ep.trajectories},
            "rewards": ep.rewards,
            "finish_reason": ep.finish_reason,
            "error": ep.error,
            "trajectories": [
                [t.role, *a.stored()] for t, a in zip(ep.trajectories, arrays, strict=True)
            ],
        }
        storage.transcripts.insert(
            tx,
            (ep.id, ep.task_id, step, int(ep.error is not None), now, msgpack.packb(body)),
        )


def _arrays(role: str, stored: list[bytes]) -> TrajectoryArrays:
    import numpy as np

    tokens, mask, logprobs, versions = unstore(*stored)
    return TrajectoryArrays(
        role=role,
        tokens=np.frombuffer(tokens, "<i4").tolist(),
        loss_mask=np.frombuffer(mask, "<i4").tolist(),
        logprobs=[round(x, 5) for x in np.frombuffer(logprobs, "<f4").tolist()],
        versions=np.frombuffer(versions, "<i4").tolist(),
    )


def read(
    tx: Tx, step: int | None = None, failed: bool | None = None, limit: int = 50
) -> list[TranscriptRecord]:
    """The kept transcripts (newest step first), each with its samples' group advantages and
    what became of each sample (trained in which step, filtered, dropped, still buffered)."""
    rows = storage.transcripts.select(tx, step, failed, limit)
    records = []
    for row in rows:
        body = msgpack.unpackb(row.body)
        records.append(
            TranscriptRecord(
                episode_id=row.episode_id,
                task_id=row.task_id,
                step=row.step,
                failed=bool(row.failed),
                created_at=row.created_at,
                policy=body["policy"],
                rewards=body["rewards"],
                finish_reason=body["finish_reason"],
                error=body["error"],
                trajectories=[_arrays(role, stored) for role, *stored in body["trajectories"]],
            )
        )
    group_ids = sorted({f"{r.task_id}/{p}" for r in records for p in r.policy.values()})
    stats = storage.transcripts.group_stats(tx, group_ids)
    fates = storage.transcripts.group_fates(tx, group_ids)
    for r in records:
        for role, policy in r.policy.items():
            group = stats.get(f"{r.task_id}/{policy}")
            if group is not None and role in r.rewards:
                advantage = (r.rewards[role] - group.reward_mean) / (group.reward_std + 1e-4)
                r.advantages[role] = round(advantage, 4)
            fate = fates.get(f"{r.task_id}/{policy}")
            if r.failed:  # stored for the record, yields no sample (ops.ingest)
                r.fates[role] = "failed"
            else:
                r.fates[role] = "ungrouped" if fate is None else _fate(fate)
            if r.fates[role] == "trained":
                r.trained_steps[role] = int(fate.step)
        if r.failed and not r.fates:  # failed before any trajectory: the episode itself
            r.fates[""] = "failed"
    return records


def _fate(group: storage.transcripts.GroupFate) -> str:
    """One word for a group's state (see ``astraflow.protocol.transcripts.FATES``)."""
    if group.state == "batched":
        return {"acked": "trained", "served": "training", "skipped": "quarantined"}.get(
            group.batch_state or "",
            "buffered",  # a rewound batch's groups are trained again
        )
    if group.state in ("filtered", "dropped"):
        return group.state
    return "buffered"  # ready, or waiting in the replay pool
