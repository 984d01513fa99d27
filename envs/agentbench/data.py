"""Loaders for AgentBench v0.2's own data layout (a checkout's ``data/`` folder).

Layout read here (as AgentBench ships it)::

    dbbench/dev.jsonl, dbbench/standard.jsonl
    os_interaction/data/dev.json            + os_interaction/scripts/dev/
    os_interaction/data/{1..7}/*.json       + os_interaction/scripts/{1..7}/   (the standard split)
    os_interaction/res/dockerfiles/         (image recipes for the Docker sandbox)
    os_interaction/train/training.json      (optional training tasks; checks from scripts/dev/)
    alfworld/{dev,train,standard}.json      + alfworld/games/ (or alfworld/) json_2.1.1/.../game.tw-pddl
    alfworld/prompts/alfworld_multiturn_plan_first.json   (AgentBench's one-shot dialogues)

Samples become *task payloads* (plain JSON dicts) for the envs, with scripts already read from their
files, so an env never needs the data folder: a payload is the whole task.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from astraflow.errors import AstraFlowError

ENV_VAR = "ASTRAFLOW_AGENTBENCH_DATA"
SPLITS = ("dev", "standard")


class DataError(AstraFlowError, ValueError):
    """A data folder or file that does not have AgentBench's layout; says what was expected."""


def default_data_dir() -> Path:
    """``$ASTRAFLOW_AGENTBENCH_DATA``, else the ``shared/data/agentbench`` folder beside the repo."""
    env = os.environ.get(ENV_VAR)
    if env:
        return Path(env)
    repo = Path(__file__).resolve().parents[2]
    return repo.parent / "shared" / "data" / "agentbench"


def resolve_data_dir(data_dir: str | Path | None) -> Path:
    path = Path(data_dir) if data_dir is not None else default_data_dir()
    if not path.is_dir():
        raise DataError(
            f"AgentBench data folder {path} does not exist; pass --data DIR (an AgentBench "
            f"checkout's data/ folder) or set {ENV_VAR}"
        )
    return path


# --- dbbench ----------------------------------------------------------------------------------


def load_dbbench(data_dir: str | Path | None = None, split: str = "dev") -> list[dict[str, Any]]:
    """dbbench samples of ``split`` as payloads for ``astraflow/AgentBench-DB-v0``."""
    if split not in SPLITS:
        raise DataError(f"dbbench split must be one of {', '.join(SPLITS)}, got {split!r}")
    root = resolve_data_dir(data_dir)
    path = root / "dbbench" / f"{split}.jsonl"
    if not path.is_file():
        raise DataError(f"dbbench split {split!r} expects the file {path}")
    payloads = []
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f):
            if not line.strip():
                continue
            try:
                entry = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataError(f"{path}:{lineno + 1}: not JSON ({exc})") from None
            payloads.append(db_payload(entry, f"dbbench-{split}-{lineno:05d}", path, lineno))
    return payloads


def db_payload(entry: dict[str, Any], sample_id: str, path: Path | str = "?", lineno: int = 0):
    for key in ("description", "table", "type"):
        if key not in entry:
            raise DataError(f"{path}:{lineno + 1}: dbbench entry lacks {key!r}")
    table = entry["table"]
    info = table.get("table_info", {})
    typ = entry["type"][0] if isinstance(entry["type"], list) else str(entry["type"])
    payload = {
        "id": sample_id,
        "description": entry["description"],
        "add_description": entry.get("add_description", ""),
        "type": typ,
        "table_name": table["table_name"],
        "columns": [c["name"] for c in info.get("columns", [])],
        "rows": [[None if v is None else str(v) for v in row] for row in info.get("rows", [])],
        "label": entry.get("label", []),
    }
    if typ in ("INSERT", "DELETE", "UPDATE"):
        if "answer_md5" not in entry:
            raise DataError(f"{path}:{lineno + 1}: {typ} entry lacks 'answer_md5'")
        payload["answer_md5"] = entry["answer_md5"]
    return payload


# --- os_interaction ---------------------------------------------------------------------------

_USER_MGMT = re.compile(
    r"\b(useradd|userdel|usermod|adduser|deluser|groupadd|groupdel|chpasswd|passwd)\b"
)
_NETWORK = re.compile(
    r"\b(apt-get|apt|pip3?|npm|curl|wget|git\s+clone|ping|ssh|scp)\b[^\n]*"
    r"(install|update|https?://|\bclone\b|\S+\.(com|org|net|io)\b)"
)


def load_os(data_dir: str | Path | None = None, split: str = "dev") -> list[dict[str, Any]]:
    """os_interaction samples as payloads for ``astraflow/AgentBench-OS-v0``.

    ``split``: ``dev`` (data/dev.json), ``standard`` (data/1..7/*.json, AgentBench's os-std) or
    ``train`` (train/training.json, checked with the scripts of scripts/dev/).
    """
    root = resolve_data_dir(data_dir) / "os_interaction"
    if split == "dev":
        files = [(root / "data" / "dev.json", root / "scripts" / "dev", "dev-001-dev-")]
    elif split == "standard":
        files = []
        for group in range(1, 8):
            for f in sorted((root / "data" / str(group)).glob("*.json")):
                prefix = f"std-{group:03d}-{f.stem}-"
                files.append((f, root / "scripts" / str(group), prefix))
        if not files:
            raise DataError(f"os_interaction standard split expects {root}/data/1..7/*.json")
    elif split == "train":
        files = [(root / "train" / "training.json", root / "scripts" / "dev", "train-")]
    else:
        raise DataError(f"os_interaction split must be dev, standard or train, got {split!r}")
    payloads: list[dict[str, Any]] = []
    for path, script_dir, prefix in files:
        if not path.is_file():
            raise DataError(f"os_interaction split {split!r} expects the file {path}")
        raw = json.loads(path.read_text(encoding="utf-8"))
        items = raw if isinstance(raw, list) else [raw]
        for idx, item in enumerate(items):
            payloads.append(os_payload(item, f"{prefix}{idx:05d}", script_dir, f"{path}[{idx}]"))
    return payloads


def _load_script(obj: Any, script_dir: Path, where: str) -> list[str] | None:
    """AgentBench's script object -> [language, code] (None stays None)."""
    if obj is None:
        return None
    if isinstance(obj, str):
        return ["bash", obj]
    if not isinstance(obj, dict):
        raise DataError(f"{where}: a script must be a string or an object, got {obj!r}")
    language = obj.get("language", "bash")
    if "file" in obj:
        path = script_dir / obj["file"]
        if not path.is_file():
            raise DataError(f"{where}: script file {path} does not exist")
        return [language, path.read_text(encoding="utf-8")]
    if "code" in obj:
        return [language, obj["code"]]
    raise DataError(f"{where}: a script object needs 'file' or 'code', got keys {sorted(obj)}")


def os_payload(item: dict[str, Any], sample_id: str, script_dir: Path, where: str = "?"):
    """One os_interaction item -> payload, read exactly as AgentBench's config loader reads it."""
    if "description" not in item or "evaluation" not in item:
        raise DataError(f"{where}: os_interaction item needs 'description' and 'evaluation'")
    create = item.get("create")
    init: list[list[str]] = []
    image = "default"
    if isinstance(create, dict):  # AgentBench only looks into a dict ("in" on a list finds nothing)
        image = str(create.get("image", "default")).rsplit("/", 1)[-1]
        if "init" in create:
            scripts = create["init"] if isinstance(create["init"], list) else [create["init"]]
            init = [s for s in (_load_script(x, script_dir, where) for x in scripts) if s]
    start = _load_script(item["start"], script_dir, where) if "start" in item else None
    evaluation = item["evaluation"]
    match: dict[str, Any] | None = None
    check: list[list[str] | None] | None = None
    example = None
    if "match" in evaluation:
        m = evaluation["match"]
        match = {"answer": m, "strip": True} if isinstance(m, str) else dict(m)
    elif "check" in evaluation:
        c = evaluation["check"]
        check = [_load_script(x, script_dir, where) for x in (c if isinstance(c, list) else [c])]
        if "example" in evaluation:
            example = _load_script(evaluation["example"], script_dir, where)
    else:
        raise DataError(f"{where}: evaluation needs 'check' or 'match'")
    if check is not None and any(s is None for s in check) and example is None:
        raise DataError(f"{where}: a null check step needs evaluation.example")
    # The reference solution (for the oracle): evaluation.example, else a top-level example.
    solution = example
    if solution is None and "example" in item:
        solution = _load_script(item["example"], script_dir, where)
    payload = {
        "id": sample_id,
        "description": item["description"],
        "image": image,
        "init": init,
        "start": start,
        "match": match,
        "check": check,
        "example": example,
        "solution": solution,
        "labels": list(item.get("labels", [])),
        "requires": requirements(init, start),
    }
    return payload


def requirements(init: list[list[str]], start: list[str] | None) -> list[str]:
    """Capabilities the set-up scripts need: ``users`` (account management), ``network``."""
    code = "\n".join(s[1] for s in [*init, *([start] if start else [])])
    needs = []
    if _USER_MGMT.search(code):
        needs.append("users")
    if _NETWORK.search(code):
        needs.append("network")
    return needs


def dockerfiles_dir(data_dir: str | Path | None = None) -> Path:
    return resolve_data_dir(data_dir) / "os_interaction" / "res" / "dockerfiles"


# --- alfworld ---------------------------------------------------------------------------------

ALFWORLD_SPLITS = ("dev", "train", "standard")


def load_alfworld(
    data_dir: str | Path | None = None, split: str = "dev", prompts: str | None = None
) -> list[dict[str, Any]]:
    """ALFWorld games of ``split`` as payloads for ``astraflow/AgentBench-ALFWorld-v0``.

    ``alfworld/{split}.json`` groups game paths by task type, as AgentBench's does; the paths are
    relative to ``alfworld/games/`` (or to ``alfworld/`` itself, AgentBench's own layout). Each game
    is put back into AgentBench v0.2's wording (:mod:`astraflow.envs.agentbench.alfworld.wording`) and carries
    its task type's one-shot dialogue from ``prompts`` (a file name in ``alfworld/prompts/`` or a
    path; default: the file AgentBench v0.2 uses), so a payload is the whole task.
    """
    from astraflow.envs.agentbench.alfworld import protocol
    from astraflow.envs.agentbench.alfworld.wording import WordingError, to_v02

    if split not in ALFWORLD_SPLITS:
        raise DataError(
            f"alfworld split must be one of {', '.join(ALFWORLD_SPLITS)}, got {split!r}"
        )
    root = resolve_data_dir(data_dir) / "alfworld"
    index = root / f"{split}.json"
    if not index.is_file():
        raise DataError(f"alfworld split {split!r} expects the file {index}")
    groups = json.loads(index.read_text(encoding="utf-8"))
    if not isinstance(groups, dict):
        raise DataError(f"{index}: expected an object of task type -> list of game paths")
    examples = load_alfworld_prompts(root, prompts)
    games_dir = root / "games" if (root / "games").is_dir() else root
    payloads: list[dict[str, Any]] = []
    for group, paths in groups.items():
        for rel in paths:
            path = games_dir / rel
            if not path.is_file():
                raise DataError(f"{index}: game {rel!r} not found at {path}")
            name = "/".join(Path(rel).parts[-3:-1])  # task folder/trial, as AgentBench names it
            try:
                key = protocol.prompt_key(name)
                game = to_v02(json.loads(path.read_text(encoding="utf-8")), str(path))
            except (ValueError, WordingError) as exc:
                raise DataError(f"{index}: {exc}") from None
            if key not in examples:
                raise DataError(f"the ALFWorld prompts have no one-shot dialogue {key!r}")
            payloads.append(
                {
                    "id": f"alfworld-{split}-{len(payloads):04d}",
                    "name": name,
                    "type": key,
                    "group": group,
                    "pddl_domain": game["pddl_domain"],
                    "grammar": game["grammar"],
                    "pddl_problem": game["pddl_problem"],
                    "walkthrough": game["walkthrough"],
                    "example": list(examples[key]),
                }
            )
    return payloads


def load_alfworld_prompts(root: Path, prompts: str | None = None) -> dict[str, list[str]]:
    """AgentBench's one-shot dialogues by task type (``put``, ``clean``, ...)."""
    from astraflow.envs.agentbench.alfworld.protocol import DEFAULT_PROMPTS

    path = Path(prompts) if prompts and Path(prompts).is_file() else None
    if path is None:
        path = root / "prompts" / (prompts or DEFAULT_PROMPTS)
    if not path.is_file():
        raise DataError(f"ALFWorld prompts file {path} does not exist")
    data = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict) or not all(
        isinstance(v, list) and all(isinstance(t, str) for t in v) for v in data.values()
    ):
        raise DataError(f"{path}: expected an object of task type -> list of message strings")
    return data


# --- task-set loaders (tasks catalogue signature: split, seed, **kwargs) -----------------------


def _shuffled(items: list[dict[str, Any]], seed: int, max_chars: int | None):
    import random

    if max_chars is not None:
        items = [p for p in items if len(p["description"]) <= max_chars]
    random.Random(seed).shuffle(items)
    return items


def os_task_set(
    split: str = "train",
    seed: int = 0,
    data_dir: str | None = None,
    max_chars: int | None = None,
    **_: Any,
) -> list[dict[str, Any]]:
    """Task-set loader for recipes: OS tasks shuffled by ``seed``; ``max_chars`` keeps only tasks
    whose description is that short (for small-context models)."""
    return _shuffled(load_os(data_dir, split), seed, max_chars)


def db_task_set(
    split: str = "dev",
    seed: int = 0,
    data_dir: str | None = None,
    path: str | None = None,
    max_chars: int | None = None,
    **_: Any,
) -> list[dict[str, Any]]:
    """Task-set loader for recipes: dbbench tasks shuffled by ``seed``.

    AgentBench ships no dbbench training split; ``path`` names any JSONL file in dbbench's format
    (your own training tasks) instead of ``data_dir``/dbbench/``split``.jsonl.
    """
    if path is None:
        items = load_dbbench(data_dir, split)
    else:
        file = Path(path)
        if not file.is_file():
            raise DataError(f"dbbench task file {file} does not exist")
        items = [
            db_payload(json.loads(line), f"{file.stem}-{i:05d}", file, i)
            for i, line in enumerate(file.read_text(encoding="utf-8").splitlines())
            if line.strip()
        ]
    return _shuffled(items, seed, max_chars)


def alfworld_task_set(
    split: str = "train",
    seed: int = 0,
    data_dir: str | None = None,
    prompts: str | None = None,
    **_: Any,
) -> list[dict[str, Any]]:
    """Task-set loader for recipes: ALFWorld games (train: 300, dev: 20) shuffled by ``seed``."""
    import random

    items = load_alfworld(data_dir, split, prompts)
    random.Random(seed).shuffle(items)
    return items
