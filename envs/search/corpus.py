"""Passages and QA records: the JSONL formats the search env reads, and their loaders.

Corpus JSONL: one ``{"title": str, "text": str}`` per line (``id`` optional). QA files: NQ-open
style ``{"question": str, "answer": [str, ...]}`` or HotpotQA style ``{"question": str, "answer":
str}`` (``answers``/``golden_answers`` are accepted for ``answer``; ``id``/``_id`` optional), as
JSONL or as one JSON list.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from astraflow.errors import AstraFlowError


class CorpusError(AstraFlowError, ValueError):
    """A corpus or QA file that cannot be used; names the file, the line and what was expected."""


@dataclass(frozen=True)
class Passage:
    id: str
    title: str
    text: str

    def index_text(self) -> str:
        """What BM25 sees: the title matters (qualified names, page titles), so it is included."""
        return f"{self.title}. {self.text}" if self.title else self.text


def _records(path: Path) -> list[tuple[int, Any]]:
    """(line number, parsed value) of a JSONL file, or (index, item) of a JSON list."""
    if not path.is_file():
        raise CorpusError(f"file not found: {path}")
    text = path.read_text(encoding="utf-8")
    stripped = text.lstrip()
    if stripped.startswith("["):
        try:
            items = json.loads(text)
        except json.JSONDecodeError as exc:
            raise CorpusError(f"{path}: not valid JSON: {exc}") from None
        return list(enumerate(items, start=1))
    out = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            out.append((lineno, json.loads(line)))
        except json.JSONDecodeError as exc:
            raise CorpusError(f"{path}:{lineno}: not valid JSON: {exc}") from None
    return out


def load_corpus_jsonl(path: str | os.PathLike[str]) -> list[Passage]:
    """Passages of a JSONL corpus (``title``, ``text``, optional ``id``)."""
    path = Path(path)
    passages = []
    for lineno, rec in _records(path):
        if not isinstance(rec, dict) or not isinstance(rec.get("text"), str):
            raise CorpusError(
                f"{path}:{lineno}: expected an object with a string 'text' (and optional 'title', "
                f"'id'), got {str(rec)[:80]!r}"
            )
        title = rec.get("title", "")
        if not isinstance(title, str):
            raise CorpusError(
                f"{path}:{lineno}: 'title' must be a string, got {type(title).__name__}"
            )
        passages.append(Passage(str(rec.get("id", lineno)), title, rec["text"]))
    if not passages:
        raise CorpusError(f"{path}: corpus is empty")
    return passages


def normalise_answers(value: Any, where: str) -> list[str]:
    """Gold answers as a non-empty list of strings."""
    if isinstance(value, str):
        value = [value]
    if (
        not isinstance(value, (list, tuple))
        or not value
        or not all(isinstance(a, (str, int, float)) and not isinstance(a, bool) for a in value)
    ):
        raise CorpusError(
            f"{where}: 'answer' must be a string or a non-empty list of strings, got {value!r:.80}"
        )
    return [str(a) for a in value]


def load_qa_file(path: str | os.PathLike[str], prefix: str | None = None) -> list[dict[str, Any]]:
    """QA records as search-env payloads ``{"id", "question", "answer": [...]}``."""
    path = Path(path)
    prefix = prefix or path.stem
    out = []
    for lineno, rec in _records(path):
        where = f"{path}:{lineno}"
        if not isinstance(rec, dict) or not isinstance(rec.get("question"), str):
            raise CorpusError(
                f"{where}: expected an object with a string 'question', got {str(rec)[:80]!r}"
            )
        key = next((k for k in ("answer", "answers", "golden_answers") if k in rec), None)
        if key is None:
            raise CorpusError(f"{where}: missing 'answer' (a string or a list of strings)")
        rid = rec.get("id", rec.get("_id", f"{prefix}-{lineno}"))
        out.append(
            {
                "id": str(rid),
                "question": rec["question"],
                "answer": normalise_answers(rec[key], where),
            }
        )
    return out


def write_jsonl(path: Path, rows: Iterable[dict[str, Any]]) -> None:
    """Write atomically (temp file + rename) so concurrent readers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with tmp.open("w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")
    os.replace(tmp, path)


def passages_to_rows(passages: Iterable[Passage]) -> list[dict[str, Any]]:
    return [asdict(p) for p in passages]
