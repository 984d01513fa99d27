"""Task sets in other ecosystems' formats: SkyRL's parquet rows, a verifiers environment's own
dataset, seeded TextArena games and seeded Gymnasium resets (the payloads of the ``skyrl:``,
``verifiers:``, ``textarena:`` and ``gym:`` envs)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from astraflow.tasks.base import Payload

#: SkyRL's dataset columns; ``prompt`` and ``reward_spec`` are required
SKYRL_COLUMNS = ("prompt", "env_class", "reward_spec", "extra_info")


def skyrl_parquet(*, path: str, split: str = "train", seed: int = 0, **_: Any) -> list[Payload]:
    """Rows of a SkyRL dataset file (parquet, as SkyRL writes it) as they are, each with an id.

    ``path`` may name the file or a folder holding ``{split}.parquet``."""
    import datasets  # a core dependency; reads parquet through pyarrow

    file = Path(path)
    if file.is_dir():
        file = file / f"{split}.parquet"
    if not file.is_file():
        raise FileNotFoundError(f"skyrl_parquet: no file {str(file)!r} (kwargs.path)")
    rows = datasets.load_dataset("parquet", data_files=str(file), split="train")
    missing = [c for c in ("prompt", "reward_spec") if c not in rows.column_names]
    if missing:
        raise ValueError(
            f"skyrl_parquet {str(file)!r}: missing columns {missing}; SkyRL rows have "
            f"{', '.join(SKYRL_COLUMNS)} (got {', '.join(rows.column_names)})"
        )
    out: list[Payload] = []
    for i, row in enumerate(rows):
        payload = {k: row[k] for k in row if row[k] is not None}
        extra = payload.get("extra_info") or {}
        payload.setdefault("id", f"{file.stem}-{extra.get('index', i)}")
        payload["id"] = str(payload["id"])
        json.dumps(payload)  # a payload crosses the wire as JSON
        out.append(payload)
    return out


def seeded(
    *, env: str, n: int = 64, split: str = "train", seed: int = 0, **_: Any
) -> list[Payload]:
    """``n`` seeded instances (TextArena games, Gymnasium resets): train and test seeds apart."""
    base = seed * 1_000_003 + (0 if split == "train" else 500_000)
    return [{"id": f"{env}/{split}-{i}", "seed": base + i} for i in range(int(n))]


def verifiers_rows(
    *,
    env: str,
    env_args: dict[str, Any] | None = None,
    split: str = "train",
    n: int = -1,
    seed: int = 0,  # noqa: ARG001 - the rows come in the environment's own order
    **_: Any,
) -> list[Payload]:
    """The rows of a verifiers environment's own dataset (``train``) or evaluation dataset
    (``test``), as verifiers formats them (``prompt`` messages, ``answer``, ``info``, ``task``,
    ``example_id``), each with an id. ``env``: the environment's name (``verifiers:NAME``'s
    NAME); ``env_args``: its ``load_environment`` kwargs (the same as the env's
    ``tasks.env_kwargs``)."""
    from astraflow.envs.ecosystems.verifiers_env import dataset_rows, load

    rows = dataset_rows(load(env, env_args), split, n=int(n))
    for i, row in enumerate(rows):
        row["id"] = f"{env}/{split}-{row.get('example_id', i)}"
    return rows
