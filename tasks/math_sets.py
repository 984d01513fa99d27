"""GSM8K and MATH-500 as math-env payloads ``{"id", "question", "answer", "level"?}``.

Local files by default (``data_dir()/math/...``, see :mod:`astraflow.tasks.data`), a given ``path=``, or the
hub with ``source="hub"``. File order is kept; ``seed`` does not reorder (the dataflow service
samples), it is accepted for the uniform loader signature.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from astraflow.tasks.data import data_file
from astraflow.tasks.hub import load_hub_rows

from astraflow.errors import AstraFlowError

#: A prompt suffix that works for instruction-tuned models on these sets (recipes pass it as the
#: math env's ``instruction`` kwarg).
BOXED_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."


class TaskFormatError(AstraFlowError, ValueError):
    """A record of a task file without the fields its format requires."""


def gsm8k_final_answer(solution: str, where: str = "gsm8k") -> str:
    """The number after ``####`` in a GSM8K solution, without thousands separators."""
    head, sep, tail = solution.rpartition("####")
    if not sep or not tail.strip():
        raise TaskFormatError(f"{where}: answer has no '#### N' final line: {solution[-80:]!r}")
    return tail.strip().replace(",", "")


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    rows = []
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise TaskFormatError(f"{path}:{lineno}: not valid JSON: {exc}") from None
    return rows


def _require(row: Any, fields: tuple[str, ...], where: str) -> None:
    if not isinstance(row, dict):
        raise TaskFormatError(
            f"{where}: expected an object with {fields}, got {type(row).__name__}"
        )
    missing = [f for f in fields if f not in row]
    if missing:
        raise TaskFormatError(f"{where}: missing field(s) {missing}; expected {fields}")


def gsm8k(split: str = "train", seed: int = 0, path: str | os.PathLike[str] | None = None,
          source: str = "local", **_: Any) -> list[dict[str, Any]]:  # fmt: skip
    """GSM8K: ``question``; the gold answer is what follows ``####`` in ``answer``."""
    if source == "hub":
        rows = load_hub_rows("openai/gsm8k", "main", split)
        origin = "hub:openai/gsm8k"
    elif source == "local":
        file = data_file(f"math/gsm8k_{split}.jsonl", f"GSM8K {split}", path)
        rows, origin = _read_jsonl(file), str(file)
    else:
        raise ValueError(f"gsm8k: source must be 'local' or 'hub', got {source!r}")
    out = []
    for i, row in enumerate(rows):
        where = f"{origin} record {i + 1}"
        _require(row, ("question", "answer"), where)
        out.append({
            "id": f"gsm8k-{split}-{i}",
            "question": row["question"],
            "answer": gsm8k_final_answer(row["answer"], where),
        })  # fmt: skip
    return out


def math500(split: str = "test", seed: int = 0, path: str | os.PathLike[str] | None = None,
            source: str = "local", **_: Any) -> list[dict[str, Any]]:  # fmt: skip
    """MATH-500: ``problem`` and its final ``answer`` (LaTeX), level from ``difficulty``/``level``."""
    if source == "hub":
        rows = load_hub_rows("HuggingFaceH4/MATH-500", None, split)
        origin = "hub:HuggingFaceH4/MATH-500"
    elif source == "local":
        file = data_file("math/math500.json", "MATH-500", path)
        text = file.read_text(encoding="utf-8")
        rows = json.loads(text) if text.lstrip().startswith("[") else _read_jsonl(file)
        origin = str(file)
    else:
        raise ValueError(f"math500: source must be 'local' or 'hub', got {source!r}")
    out = []
    for i, row in enumerate(rows):
        where = f"{origin} record {i + 1}"
        _require(row, ("problem", "answer"), where)
        payload = {
            "id": str(row.get("unique_id", f"math500-{i}")),
            "question": row["problem"],
            "answer": str(row["answer"]),
        }
        level = row.get("difficulty", row.get("level"))
        if isinstance(level, (int, float)):
            payload["level"] = int(level)
        elif isinstance(level, str) and level.split()[-1].isdigit():  # hub rows: "Level 3"
            payload["level"] = int(level.split()[-1])
        out.append(payload)
    return out


def math_file(split: str = "train", seed: int = 0, path: str | os.PathLike[str] | None = None,
              question_field: str = "question", answer_field: str = "answer",
              **_: Any) -> list[dict[str, Any]]:  # fmt: skip
    """Any JSONL / JSON-list file of problems, with the field names given."""
    if path is None:
        raise ValueError("math_file: pass path=... (a JSONL or JSON list of problems)")
    file = data_file("", "math_file", path)
    text = file.read_text(encoding="utf-8")
    rows = json.loads(text) if text.lstrip().startswith("[") else _read_jsonl(file)
    out = []
    for i, row in enumerate(rows):
        where = f"{file} record {i + 1}"
        _require(row, (question_field, answer_field), where)
        out.append({
            "id": str(row.get("id", f"{file.stem}-{i}")),
            "question": str(row[question_field]),
            "answer": str(row[answer_field]),
        })  # fmt: skip
    return out
