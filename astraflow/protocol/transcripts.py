"""Transcripts: an episode's token sequences as text a person can read, turn by turn.

A trajectory is one growing token sequence per role (token-in/token-out); its loss mask is 1 on
the tokens the role's policy generated. Cutting it at every change of the mask gives the turns:
context (the prompt, env observations, other roles' text) and the policy's own generations, each
decoded on its own. The same cut serves `eval run`'s JSON, the dataflow's sampled transcripts,
`astraflow transcripts` and the dashboard's trajectory viewer, so they all show one thing.

Decoding needs the policy's tokenizer, which the caller passes as a plain function.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from pydantic import BaseModel, Field

#: the longest text kept per turn (a transcript is for reading, not for replay)
MAX_TURN_CHARS = 4000


class TranscriptTurn(BaseModel):
    """One run of tokens of the same kind in one role's sequence."""

    role: str = Field(description="The trajectory's role")
    source: str = Field(description="'context' (prompt, env, other roles) or 'policy' (generated)")
    text: str
    start: int = Field(description="Index of the turn's first token in the sequence")
    tokens: int
    versions: list[int] = Field(default_factory=list, description="Weight versions of its tokens")


class TrajectoryArrays(BaseModel):
    """One role's per-token arrays, as the trainer sees them."""

    role: str
    tokens: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    versions: list[int]


class TranscriptRecord(BaseModel):
    """A finished episode the dataflow kept (``GET /transcripts``): tokens, not text; the reader
    decodes with the policy's tokenizer (the dataflow service loads no model)."""

    episode_id: str
    task_id: str
    step: int = Field(description="Weight version that generated the episode (-1: none)")
    failed: bool
    created_at: float
    policy: dict[str, str] = Field(default_factory=dict, description="role -> policy")
    rewards: dict[str, float] = Field(default_factory=dict)
    finish_reason: str = ""
    error: str | None = None
    trajectories: list[TrajectoryArrays] = Field(default_factory=list)
    #: per role: the advantage the episode's sample got in its group (reward - mean) / std
    advantages: dict[str, float] = Field(default_factory=dict)
    #: per role: what became of its sample (:data:`FATES`), so a reader never mistakes an
    #: episode the trainer never saw for one it learned from (role ``""``: an episode that failed
    #: before it had any trajectory)
    fates: dict[str, str] = Field(default_factory=dict)
    #: per role: the step that trained its sample (only for fate ``trained``)
    trained_steps: dict[str, int] = Field(default_factory=dict)

    @property
    def trained(self) -> bool:
        """Some role's sample was in a step the trainer acknowledged."""
        return any(f == "trained" for f in self.fates.values())


#: what became of a kept episode's sample, per role, and what each means to a reader
FATES: dict[str, str] = {
    "trained": "trained (in an acknowledged step)",
    "training": "in a batch the trainer holds (not acknowledged yet)",
    "buffered": "in the buffer, not trained yet",
    "filtered": "its group was filtered out (e.g. zero reward variance): never trained",
    "dropped": "its group was dropped (too stale, or over the buffer's bound): never trained",
    "quarantined": "in a batch set aside after the trainer failed on it: never trained",
    "failed": "the episode failed (an error): it yields no sample, never trained",
    "ungrouped": "its group is not complete yet",
}


class TranscriptList(BaseModel):
    transcripts: list[TranscriptRecord]


class Transcript(BaseModel):
    """One kept episode, decoded: what `astraflow transcripts` prints and the viewer shows."""

    record: TranscriptRecord
    turns: list[TranscriptTurn]


def _clip(text: str) -> str:
    return text if len(text) <= MAX_TURN_CHARS else text[: MAX_TURN_CHARS - 1] + "…"


def split_turns(
    role: str,
    tokens: Sequence[int],
    loss_mask: Sequence[int],
    versions: Sequence[int],
    decode: Callable[[list[int]], str],
) -> list[TranscriptTurn]:
    """The turns of one role's sequence: a new turn wherever the loss mask changes."""
    turns: list[TranscriptTurn] = []
    start = 0
    n = len(tokens)
    for i in range(1, n + 1):
        if i == n or bool(loss_mask[i]) != bool(loss_mask[start]):
            generated = bool(loss_mask[start])
            ids = [int(t) for t in tokens[start:i]]
            vs = sorted({int(v) for v in versions[start:i] if int(v) >= 0}) if generated else []
            turns.append(
                TranscriptTurn(
                    role=role,
                    source="policy" if generated else "context",
                    text=_clip(decode(ids)),
                    start=start,
                    tokens=i - start,
                    versions=vs,
                )
            )
            start = i
    return turns


def episode_turns(episode: Any, decode: Callable[[list[int]], str]) -> list[TranscriptTurn]:
    """Every role's turns of an :class:`~astraflow.protocol.Episode` (or a
    :class:`TranscriptRecord`), role by role."""
    out: list[TranscriptTurn] = []
    for t in episode.trajectories:
        out += split_turns(t.role, t.tokens, t.loss_mask, t.versions, decode)
    return out


def short(transcript_turns: Sequence[TranscriptTurn], width: int = 160) -> str:
    """One line: the last context turn and the policy's answer, for an error message."""
    prompt = next((t.text for t in reversed(transcript_turns) if t.source == "context"), "")
    answer = next((t.text for t in reversed(transcript_turns) if t.source == "policy"), "")
    line = f"{' '.join(prompt.split())!r} -> {' '.join(answer.split())!r}"
    return line if len(line) <= width else line[: width - 1] + "…"
