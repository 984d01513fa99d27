"""AgentBench's metrics over scored samples: the JSON report of ``astraflow eval agentbench``.

Why here: the per-family figures (success rate over samples not skipped, the status histogram, and
for dbbench AgentBench's categories and ``overall_cat_accuracy``) are AgentBench's scoring, which
belongs with the envs and the data. Running the episodes is the rollout side's job
(:mod:`astraflow.rollout.evaluation`); it hands each outcome over as a :class:`SampleResult`.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class SampleResult:
    family: str
    sample_id: str
    status: str
    passed: bool
    skipped: bool = False
    reason: str = ""
    turns: int = 0
    type: str = ""
    answer: str | None = None
    seconds: float = 0.0
    #: The agent's replies (each cut at 2000 characters), for reading failures.
    replies: list[str] = field(default_factory=list)
    #: Why the workflow ended the episode (terminated, length, turn_limit, ...); "" when it never ran.
    finish_reason: str = ""


def build_report(results: dict[str, list[SampleResult]], meta: dict[str, Any]) -> dict[str, Any]:
    """Per family: total, passed, skipped, success_rate (over samples not skipped), statuses,
    average turns; dbbench adds by_type, AgentBench's categories and overall_cat_accuracy;
    alfworld adds by_type (its task types)."""
    report: dict[str, Any] = {"meta": meta, "tasks": {}, "samples": {}}
    for family, items in results.items():
        ran = [r for r in items if not r.skipped]
        passed = sum(r.passed for r in ran)
        fam: dict[str, Any] = {
            "total": len(items),
            "passed": passed,
            "skipped": len(items) - len(ran),
            "success_rate": round(passed / len(ran), 4) if ran else 0.0,
            "status": dict(Counter(r.status for r in items)),
            "avg_turns": round(sum(r.turns for r in ran) / len(ran), 3) if ran else 0.0,
        }
        if family == "dbbench":
            fam.update(_db_categories(ran))
        elif family == "alfworld":
            fam["by_type"] = _by_type(ran)
        report["tasks"][family] = fam
        report["samples"][family] = [asdict(r) for r in items]
    return report


def _by_type(ran: list[SampleResult]) -> dict[str, dict[str, int]]:
    """Passed and total per sample type (ALFWorld: put, clean, heat, cool, examine, puttwo)."""
    by_type: dict[str, dict[str, int]] = {}
    for r in ran:
        slot = by_type.setdefault(r.type, {"total": 0, "passed": 0})
        slot["total"] += 1
        slot["passed"] += int(r.passed)
    return dict(sorted(by_type.items()))


def _db_categories(ran: list[SampleResult]) -> dict[str, Any]:
    """dbbench's per-type table and AgentBench's SELECT/INSERT/UPDATE category accuracy."""
    by_type: dict[str, dict[str, int]] = {}
    cats: dict[str, dict[str, int]] = {}
    for r in ran:
        cat = r.type if r.type in ("INSERT", "UPDATE", "DELETE") else "SELECT"
        for table, key in ((by_type, r.type), (cats, cat)):
            slot = table.setdefault(key, {"total": 0, "passed": 0})
            slot["total"] += 1
            slot["passed"] += int(r.passed)
    accs = [
        cats[c]["passed"] / cats[c]["total"]
        for c in ("SELECT", "INSERT", "UPDATE")
        if c in cats and cats[c]["total"]
    ]
    return {
        "by_type": dict(sorted(by_type.items())),
        "by_category": cats,
        "overall_cat_accuracy": round(sum(accs) / len(accs), 4) if accs else 0.0,
    }


def write_report(report: dict[str, Any], path: str | Path) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
