"""A running run's ``GET /status``, read the way the launcher reads it: the dataflow URL from
``run_dir/dataflow.url``, the run secret from ``run_dir/run.secret``, the typed client.

Benches watch a run through this (and read a finished one from its ``metrics.jsonl``), never
through the store: the store's schema is the dataflow's own business.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def read_status(run_dir: Path, ca_file: str | None = None, timeout: float = 10.0) -> Any | None:
    """The run's :class:`~astraflow.protocol.status.DataflowStatus`; None while the service is not
    up yet (no URL file, no secret) or does not answer."""
    from astraflow.launch.security import read_secret
    from astraflow.protocol.client import DataflowClientError, SyncDataflowClient

    url_file = Path(run_dir) / "dataflow.url"
    if not url_file.exists():
        return None
    try:
        token = read_secret(Path(run_dir))
        url = url_file.read_text().strip()
        with SyncDataflowClient(url, token, timeout=timeout, retries=0, ca_file=ca_file) as c:
            return c.status()
    except (OSError, ValueError, DataflowClientError):
        return None


def window_rate(
    samples: list[tuple[float, int]], start: float, end: float
) -> tuple[float | None, int]:
    """Per second over [start, end] of a growing count sampled as ``(time, count)``: from the
    first sample at or after ``start`` to the last at or before ``end``; and how many it grew."""
    inside = [(t, n) for t, n in samples if start <= t <= end]
    if len(inside) < 2 or inside[-1][0] <= inside[0][0]:
        return None, 0
    (t_a, n_a), (t_b, n_b) = inside[0], inside[-1]
    grew = n_b - n_a
    return (grew / (t_b - t_a) if grew else None), grew
