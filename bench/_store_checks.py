"""Invariants of a finished run and its rollout history, as the dataflow recorded them.

The dataflow service audits its own store when it stops (``astraflow/dataflow/storage/audit.py``:
no task lost, none trained twice, the rules behind them) and writes the result, with the run's
lease and node history, in the ``run_summary`` record of ``metrics.jsonl``. These pure functions
read that record, so a bench and a test share them without opening the store.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from _records import read_jsonl, run_summary


def summary_of(run_dir: Path) -> dict[str, Any]:
    """The run's last ``run_summary`` record; a clear error when the run left none (the dataflow
    service did not stop cleanly)."""
    summary = run_summary(read_jsonl(Path(run_dir) / "metrics.jsonl"))
    if summary is None:
        raise RuntimeError(
            f"{run_dir}/metrics.jsonl has no run_summary record: the dataflow service did not "
            "stop cleanly, so the run's invariants were not checked"
        )
    return summary


def check_store(summary: dict[str, Any]) -> dict[str, Any]:
    """``tasks_lost`` and ``tasks_duplicated`` (both must be 0), their breakdowns, lease and task
    counts by state, refused pushes by reason (the dataflow's audit, see its docstring)."""
    return summary["audit"]


def episodes_by_region(summary: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Training episodes per region and per node, with each node's active window."""
    out: dict[str, dict[str, Any]] = {}
    for node_id, node in summary.get("nodes", {}).items():
        if not node.get("episodes"):
            continue
        region = out.setdefault(node.get("region") or "?", {"episodes": 0, "nodes": {}})
        region["episodes"] += node["episodes"]
        region["nodes"][node.get("name") or node_id] = {
            "episodes": node["episodes"],
            "first": node["first_episode_at"],
            "last": node["last_episode_at"],
            "registered_at": node.get("registered_at"),
        }
    return out


def node_ids(summary: dict[str, Any], *, name: str | None = None, region: str | None = None):
    """Ids of the nodes with that name and/or region."""
    return [
        nid
        for nid, node in summary.get("nodes", {}).items()
        if (name is None or node.get("name") == name)
        and (region is None or node.get("region") == region)
    ]


def delivered_after(summary: dict[str, Any], nodes: list[str], t: float) -> dict[str, Any]:
    """Of ``nodes``' training leases: the first issued after ``t``, the first delivered after
    ``t``, and how many episodes those delivering after ``t`` brought."""
    mine = [lease for lease in summary.get("leases", []) if lease[0] in nodes]
    issued = [i for _, i, _, _ in mine if i > t]
    pushed = [(p, n) for _, _, p, n in mine if p > t]
    return {
        "first_lease": min(issued, default=None),
        "first_push": min((p for p, _ in pushed), default=None),
        "episodes": sum(n for _, n in pushed),
    }
