"""Stall detection: a run that works but cannot train stops with the cause named.

A run can be busy and still go nowhere: every episode fails (a workflow name no node knows, an
agent asking for a model that is not a role, prompts over the engine's context) or every group is
dropped (a policy that never earns a reward, so the zero-variance filter drops all of it). The
trainers then wait at step 0 forever while the nodes work. The launcher watches ``GET /status``
anyway; :class:`StallWatch` keeps a baseline taken at the newest optimizer step, and once
``run.stall_s`` passes without a step while the episodes since that baseline all failed, or all
their groups were dropped, it names the cause and the fix. A slow but healthy run never trips it:
one successful group in the buffer or one batch in training counts as progress.

Refused pushes are a cause of their own (``pushes_refused``): a refused push stores nothing, so a
run whose every push is refused (episode ids already pushed, versions from the future, another
task's episodes: issue 48, finding 1) ran no episode the status counts, and this check, which
looked only at stored episodes, never fired. ``/status.refused`` counts every refusal by route
and field; a stall with refused pushes or saves and no stored episode names them as the cause.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from astraflow.launch.text import safe_text
from astraflow.protocol.status import DataflowStatus

#: drop reasons that mean "the episode failed", not "the group carried no signal"
ERROR_REASONS = ("episode_error", "env_timeout")


@dataclass(frozen=True)
class Stall:
    """Why the run cannot progress; ``message`` says the cause and the fix. It quotes what nodes
    sent (episode errors, a transcript): plain text, cleaned of control characters by
    :func:`~astraflow.launch.text.safe_text`, not markup-escaped (the printer escapes it)."""

    cause: str  # "episodes_failing" | "constant_reward" | "all_dropped" | "pushes_refused"
    message: str


@dataclass
class _Baseline:
    at: float
    steps: int
    episodes: int
    errors: dict[str, int] = field(default_factory=dict)
    drops: dict[str, int] = field(default_factory=dict)
    refused: dict[str, int] = field(default_factory=dict)


#: routes whose refusals mean "the nodes' work does not reach the store"
REFUSED_ROUTES = ("/trajectories", "/partials")


def _refused(st: DataflowStatus) -> dict[str, int]:
    """Refusals of pushes and saves by reason (``/status.refused``), and the saved episodes
    discarded because a push was refused."""
    return {
        k: n
        for k, n in (st.refused or {}).items()
        if any(route in k for route in REFUSED_ROUTES) or k.startswith("discarded saved")
    }


def _steps(st: DataflowStatus) -> int:
    return sum(p.steps for p in st.policies.values() if p.trainable)


def _drops(st: DataflowStatus) -> dict[str, int]:
    out: dict[str, int] = {}
    for p in st.policies.values():
        if p.trainable:
            for reason, n in p.dropped.items():
                out[reason] = out.get(reason, 0) + n
    return out


def _delta(now: dict[str, int], then: dict[str, int]) -> dict[str, int]:
    return {k: v - then.get(k, 0) for k, v in now.items() if v - then.get(k, 0) > 0}


class StallWatch:
    """Feed it every status the launcher reads; :meth:`check` returns a :class:`Stall` once the
    run has made no training progress for ``stall_s`` seconds of failing or dropped work."""

    def __init__(self, stall_s: float, first_transcript=None):
        self.stall_s = stall_s
        #: () -> str | None: a short rendering of one recent episode (for the constant-reward
        #: message), looked up only when a stall is reported
        self.first_transcript = first_transcript
        self._base: _Baseline | None = None

    def check(self, st: DataflowStatus | None, now: float) -> Stall | None:
        if st is None or self.stall_s <= 0 or st.training_done:
            return None
        errors = {k: e.count for k, e in st.errors.items()}
        base = self._base
        busy = any(
            p.trainable and (p.buffer_groups > 0 or p.unacked_batches > 0)
            for p in st.policies.values()
        )
        if base is None or _steps(st) != base.steps or busy:
            self._base = _Baseline(now, _steps(st), st.episodes, errors, _drops(st), _refused(st))
            return None
        if now - base.at < self.stall_s:
            return None
        episodes = st.episodes - base.episodes
        waited = f"no optimizer step for {now - base.at:.0f}s (run.stall_s = {self.stall_s:g})"
        refused = _delta(_refused(st), base.refused)
        if refused and episodes <= 0:
            return Stall("pushes_refused", self._refused(refused, waited))
        if episodes <= 0:
            return None  # nothing ran at all: slow start-up or no nodes, not this check's case
        new_errors = _delta(errors, base.errors)
        failed = sum(new_errors.values())
        drops = _delta(_drops(st), base.drops)
        if failed >= episodes:
            return Stall("episodes_failing", self._failing(st, episodes, new_errors, waited))
        signal_drops = {k: v for k, v in drops.items() if k not in ERROR_REASONS}
        if not signal_drops:
            return None  # episodes succeed but nothing was dropped: a group is still forming
        return self._dropped(st, episodes, signal_drops, waited)

    def _refused(self, refused: dict[str, int], waited: str) -> str:
        total = sum(n for k, n in refused.items() if not k.startswith("discarded saved"))
        lines = [
            f"{waited}: no episode was stored, and the dataflow service refused {total:,} "
            "push(es) or save(s) since the last step: the nodes' work never reaches the trainer."
        ]
        for reason, n in sorted(refused.items(), key=lambda kv: -kv[1])[:8]:
            lines.append(f"  {safe_text(reason, 160, markup=False)}: {n:,}")
        lines.append(
            "Each refusal ended its lease (the task was leased again); the node logs in the "
            "run's logs/ folder say why each was refused. Refused pushes of every node at once "
            "point at a node build that does not match the service (or at a hostile node that "
            "poisons saved episodes: see docs/security.md)."
        )
        return "\n".join(lines)

    def _failing(self, st: DataflowStatus, episodes: int, errors: dict[str, int], waited: str):
        lines = [f"{waited}: all {episodes:,} episodes since the last step failed."]
        for reason, n in sorted(errors.items(), key=lambda kv: -kv[1]):
            summary = st.errors.get(reason)
            first = safe_text(summary.first if summary else "", 500, markup=False)
            lines.append(f"  {safe_text(reason, 80, markup=False)}: {n:,} — {first}")
        lines.append(
            "Fix the error above (the node logs in the run's logs/ folder have each traceback); "
            "`astraflow recipe check` resolves workflow names, agents and roles before a run."
        )
        return "\n".join(lines)

    def _dropped(self, st: DataflowStatus, episodes: int, drops: dict[str, int], waited: str):
        shown = ", ".join(
            f"{safe_text(k, 80, markup=False)} {v:,}" for k, v in sorted(drops.items())
        )
        rewards: dict[str, int] = {}
        for p in st.policies.values():
            if p.trainable:
                for r, n in p.filtered_rewards.items():
                    rewards[r] = rewards.get(r, 0) + n
        if set(drops) == {"zero_variance"} and len(rewards) == 1:
            reward = next(iter(rewards))
            transcript = self.first_transcript() if self.first_transcript else None
            transcript = safe_text(transcript, 300, markup=False) if transcript else None
            seen = f" (first transcript: {transcript})" if transcript else ""
            return Stall(
                "constant_reward",
                f"{waited}: every group of the last {episodes:,} episodes had constant reward "
                f"{float(reward):.1f}: nothing to learn from ({shown} samples dropped). Check the "
                f"env's answer format{seen} or remove the zero_variance filter from "
                "[[dataflow.policies]].",
            )
        return Stall(
            "all_dropped",
            f"{waited}: every group of the last {episodes:,} episodes was dropped ({shown} "
            "samples): nothing reaches the trainers. Loosen the dataflow policies that drop "
            "them, or see `astraflow transcripts RUN_DIR` for what the policy writes.",
        )
