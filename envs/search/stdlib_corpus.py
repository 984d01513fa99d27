"""A retrieval corpus and QA set that exist offline on every machine: the Python standard library's
own docstrings.

Passages are function docstrings titled by qualified name (``json.dumps``). Questions are answerable
from the corpus and only from what retrieval shows: "Which module provides the function
`get_close_matches`?" (answer ``difflib``) and "Which function in module `json` is described as:
'Serialize ``obj`` to a JSON formatted ``str``.'?" (answer ``dumps``). Generation is deterministic
for a given Python minor version (docstrings change between versions), takes well under a second,
and is cached under :func:`cache_dir`; nothing is committed to the repository.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from astraflow.envs.search.corpus import Passage, passages_to_rows, write_jsonl

#: Bump when the generation rules change, so stale caches are not reused.
GENERATOR_VERSION = 1
#: Modules whose functions make the corpus: pure-Python or long-stable C modules with good docs,
#: the same on every OS (no os.path: it is posixpath or ntpath).
MODULES = (
    "base64", "binascii", "bisect", "calendar", "colorsys", "copy", "csv", "difflib", "fnmatch",
    "functools", "glob", "gzip", "heapq", "html", "inspect", "ipaddress", "itertools", "json",
    "keyword", "linecache", "math", "operator", "pprint", "quopri", "random", "re", "secrets",
    "shlex", "shutil", "statistics", "string", "textwrap", "time", "urllib.parse", "uuid", "zlib",
)  # fmt: skip
#: Characters of a docstring kept in a passage (the opening says what the function does).
MAX_PASSAGE_CHARS = 700
#: One question in this many goes to the test split (by a hash of its id, so splits are stable).
TEST_EVERY = 5


@dataclass(frozen=True)
class StdlibSet:
    corpus_path: Path
    qa_path: Path


def cache_dir() -> Path:
    """``$ASTRAFLOW_CACHE_DIR``, else ``$XDG_CACHE_HOME/astraflow``, else ``~/.cache/astraflow``."""
    if os.environ.get("ASTRAFLOW_CACHE_DIR"):
        return Path(os.environ["ASTRAFLOW_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "astraflow"


def _owned_by(obj: Any, module: Any) -> bool:
    """Whether ``obj`` is defined by ``module`` (or by its C accelerator, e.g. ``_heapq``)."""
    owner = getattr(obj, "__module__", None)
    if owner is None:  # bound methods of a module-level instance (random.randint)
        owner = getattr(getattr(obj, "__self__", None), "__module__", None)
    last = module.__name__.rpartition(".")[2]
    return owner in (module.__name__, f"_{last}")


def _passage_text(doc: str) -> str:
    if len(doc) <= MAX_PASSAGE_CHARS:
        return doc
    cut = doc.rfind("\n\n", 0, MAX_PASSAGE_CHARS)
    return doc[: cut if cut > MAX_PASSAGE_CHARS // 3 else MAX_PASSAGE_CHARS].rstrip() + " ..."


def collect_passages(modules: tuple[str, ...] = MODULES) -> list[Passage]:
    """One passage per documented public function of ``modules``, sorted by qualified name."""
    passages = []
    for modname in modules:
        module = importlib.import_module(modname)
        names = getattr(module, "__all__", None) or [
            n for n in dir(module) if not n.startswith("_")
        ]
        for name in sorted(set(names)):
            obj = getattr(module, name, None)
            if obj is None or not inspect.isroutine(obj) or not _owned_by(obj, module):
                continue
            doc = inspect.getdoc(obj)
            if not doc or len(doc) < 20:
                continue
            qualname = f"{modname}.{name}"
            passages.append(Passage(qualname, qualname, _passage_text(doc)))
    return sorted(passages, key=lambda p: p.id)


def _split_of(qid: str) -> str:
    digest = int(hashlib.sha256(qid.encode()).hexdigest()[:8], 16)
    return "test" if digest % TEST_EVERY == 0 else "train"


def _first_line(doc: str, name: str) -> str | None:
    line = doc.strip().splitlines()[0].strip()
    if len(line) < 25 or line.startswith(f"{name}(") or name in line or "`" in line:
        return None
    return line


def make_questions(passages: list[Passage]) -> list[dict[str, Any]]:
    """Questions whose answers the corpus states, with unambiguous gold answers only."""
    modules_of: dict[str, set[str]] = {}
    line_count: dict[str, int] = {}
    for p in passages:
        module, _, name = p.id.rpartition(".")
        modules_of.setdefault(name, set()).add(module)
        line = _first_line(p.text, name)
        if line:
            line_count[line] = line_count.get(line, 0) + 1
    questions = []
    for p in passages:
        module, _, name = p.id.rpartition(".")
        if len(modules_of[name]) == 1:
            qid = f"stdlib-module-{p.id}"
            questions.append({
                "id": qid,
                "question": f"Which Python standard library module provides the function `{name}`?",
                "answer": [module],
                "kind": "module",
                "split": _split_of(qid),
            })  # fmt: skip
        line = _first_line(p.text, name)
        if line and line_count[line] == 1:
            qid = f"stdlib-function-{p.id}"
            questions.append({
                "id": qid,
                "question": f"Which function in the Python module `{module}` is described as: \"{line}\"?",
                "answer": [name, p.id],
                "kind": "function",
                "split": _split_of(qid),
            })  # fmt: skip
    return questions


def ensure_stdlib_set(root: Path | None = None) -> StdlibSet:
    """Generate (once) and return the paths of the stdlib corpus and QA set."""
    version = f"v{GENERATOR_VERSION}-py{sys.version_info.major}{sys.version_info.minor}"
    folder = (root or cache_dir()) / "search" / f"stdlib-{version}"
    result = StdlibSet(folder / "corpus.jsonl", folder / "qa.jsonl")
    if result.corpus_path.is_file() and result.qa_path.is_file():
        return result
    passages = collect_passages()
    write_jsonl(result.qa_path, make_questions(passages))
    write_jsonl(result.corpus_path, passages_to_rows(passages))
    return result


def stdlib_questions(split: str | None = None, root: Path | None = None) -> list[dict[str, Any]]:
    """QA records (``id``, ``question``, ``answer`` list, ``kind``, ``split``) of one split or all."""
    path = ensure_stdlib_set(root).qa_path
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]
    return [r for r in rows if split is None or r["split"] == split]
