"""QA task sets for ``astraflow/Search-v0``: the generated stdlib set and user QA files."""

from __future__ import annotations

import os
from typing import Any

from astraflow.envs.search.corpus import load_qa_file
from astraflow.envs.search.stdlib_corpus import stdlib_questions


def stdlib_qa(split: str = "train", seed: int = 0, **_: Any) -> list[dict[str, Any]]:
    """Questions about stdlib docstrings, answerable from the default search corpus."""
    return [
        {"id": q["id"], "question": q["question"], "answer": q["answer"]}
        for q in stdlib_questions(split)
    ]


def qa_file(split: str = "train", seed: int = 0, path: str | os.PathLike[str] | None = None,
            **_: Any) -> list[dict[str, Any]]:  # fmt: skip
    """NQ-open / HotpotQA style QA records from ``path`` (JSONL or JSON list)."""
    if path is None:
        raise ValueError("qa_file: pass path=... (JSONL or JSON list of {question, answer})")
    return load_qa_file(path)
