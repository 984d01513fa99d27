"""Optional dataset-hub source for task sets: ``datasets`` is imported only when asked for.

Why opt-in (``source="hub"``) instead of a silent fallback: a training run must not start
downloading because a local file is missing; the error for the missing file says what to do.
"""

from __future__ import annotations

from typing import Any


def load_hub_rows(repo: str, config: str | None, split: str) -> list[dict[str, Any]]:
    try:
        import datasets
    except ModuleNotFoundError as exc:
        if exc.name != "datasets":
            raise
        raise RuntimeError(
            f"source='hub' needs the `datasets` package (pip install datasets) to load {repo!r}"
        ) from None
    return [dict(row) for row in datasets.load_dataset(repo, config, split=split)]
