"""Reading a run's sampled transcripts: from its store on disk or its live service, decoded.

The dataflow keeps token arrays (:mod:`astraflow.dataflow.ops.transcript_sampling`); text needs the
policy's tokenizer, which readers load here from the run's recipe (lazily: transformers is heavy).
A finished run is read from ``RUN_DIR/dataflow.db`` read-only, a live one through
``GET /transcripts``; both give the same :class:`TranscriptRecord` objects.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

from astraflow.protocol.transcripts import Transcript, TranscriptRecord, split_turns


def read_store(
    run_dir: Path, step: int | None = None, failed: bool | None = None, limit: int = 50
) -> list[TranscriptRecord]:
    """The kept transcripts of a run directory's store (read-only; a live run may still write)."""
    from astraflow.dataflow.ops.transcript_sampling import read
    from astraflow.dataflow.storage.store import Tx

    db = run_dir / "dataflow.db"
    if not db.is_file():
        raise FileNotFoundError(f"{db} not found: is {run_dir} a run directory?")
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10.0)
    try:
        try:
            return read(Tx(conn), step, failed, limit)
        except sqlite3.OperationalError as exc:
            if "no such table" in str(exc):
                return []  # a store written before transcripts were kept
            raise
    finally:
        conn.close()


class Decoders:
    """One tokenizer per policy of a recipe, loaded on first use; token ids when none loads."""

    def __init__(self, recipe: Any | None):
        self.recipe = recipe
        self._by_policy: dict[str, Callable[[list[int]], str]] = {}

    def for_policy(self, policy: str) -> Callable[[list[int]], str]:
        if policy not in self._by_policy:
            self._by_policy[policy] = self._load(policy)
        return self._by_policy[policy]

    def _load(self, policy: str) -> Callable[[list[int]], str]:
        try:
            from astraflow.models.loading import load_tokenizer, resolve_checkpoint

            model = self.recipe.model_of(policy)  # an adapter policy decodes as its base
            tok = load_tokenizer(resolve_checkpoint(model))
            return lambda ids: tok.decode(ids, skip_special_tokens=False)
        except Exception:  # no recipe, an offline hub model: show the ids, still readable
            return lambda ids: " ".join(map(str, ids))

    def decode(self, record: TranscriptRecord) -> Transcript:
        """Each role's sequence with its own policy's tokenizer."""
        turns = []
        for t in record.trajectories:
            decode = self.for_policy(record.policy.get(t.role, "policy"))
            turns += split_turns(t.role, t.tokens, t.loss_mask, t.versions, decode)
        return Transcript(record=record, turns=turns)


def load_recipe_of(run_dir: Path):
    """The run's resolved recipe (``RUN_DIR/recipe.toml``), or None."""
    from astraflow.recipe import load_recipe

    try:
        return load_recipe(run_dir / "recipe.toml", [])
    except Exception:
        return None
