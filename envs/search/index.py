"""A BM25 index over passages (bm25s), built once per corpus file and process.

Why an in-process memo: workflows create an env per episode, and rebuilding even a small index per
episode would dominate the env's cost. The memo is keyed by the corpus file's path, size and mtime,
so an edited corpus is re-indexed.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path

from astraflow.envs.search.corpus import Passage, load_corpus_jsonl


@dataclass(frozen=True)
class Hit:
    passage: Passage
    score: float


class SearchIndex:
    """BM25 (Lucene variant) with English stopwords; query words unknown to the corpus are ignored."""

    def __init__(self, passages: list[Passage]):
        import bm25s  # imported here: `astraflow envs list` must not pay for it

        if not passages:
            raise ValueError("cannot index an empty corpus")
        self.passages = list(passages)
        self._tokenizer = bm25s.tokenization.Tokenizer(stopwords="en")
        ids = self._tokenizer.tokenize(
            [p.index_text() for p in self.passages], update_vocab=True, return_as="ids",
            show_progress=False,
        )  # fmt: skip
        self._bm25 = bm25s.BM25()
        self._bm25.index(ids, show_progress=False)

    def __len__(self) -> int:
        return len(self.passages)

    def search(self, query: str, k: int = 3) -> list[Hit]:
        """Up to ``k`` passages with a positive score, best first."""
        if k < 1 or not query.strip():
            return []
        ids = self._tokenizer.tokenize(
            [query], update_vocab=False, return_as="ids", show_progress=False
        )
        docs, scores = self._bm25.retrieve(
            ids, k=min(k, len(self.passages)), show_progress=False, n_threads=1
        )
        return [
            Hit(self.passages[int(d)], float(s))
            for d, s in zip(docs[0], scores[0], strict=True)
            if s > 0
        ]


@functools.lru_cache(maxsize=8)
def _cached_index(path: str, size: int, mtime_ns: int) -> SearchIndex:
    return SearchIndex(load_corpus_jsonl(path))


def index_for_file(path: str | os.PathLike[str]) -> SearchIndex:
    """The (memoised) index of a corpus JSONL file."""
    resolved = Path(path).resolve()
    st = resolved.stat()
    return _cached_index(str(resolved), st.st_size, st.st_mtime_ns)
