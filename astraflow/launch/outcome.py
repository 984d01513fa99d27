"""How a run ended, kept in ``RUN_DIR/outcome.json`` for whoever looks later.

Why a file: the terminal's last lines ("run failed ... ; trainer-policy exited with status 1",
the stall message) are gone once the terminal is, and a finished run's dashboard showed "-" with
no stop reason. The launcher writes this as it exits; the dashboard and scripts read it.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

FILE = "outcome.json"


@dataclass(frozen=True)
class RunOutcome:
    #: ``done``, ``failed``, ``stalled``, ``interrupted`` or ``timeout``
    outcome: str
    #: why, in the words the terminal printed
    reason: str
    #: how the services exited (``exit_summary``)
    services: str = ""
    #: the raw exit status of every service
    exit_codes: dict[str, int | None] = field(default_factory=dict)
    ended: float = field(default_factory=time.time)

    def write(self, run_dir: Path) -> None:
        tmp = Path(run_dir) / (FILE + ".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=1, sort_keys=True))
        tmp.replace(Path(run_dir) / FILE)


def describe(outcome: str, stall_message: str | None = None) -> RunOutcome:
    """The launcher's ``wait`` result (``done``, ``failed:<service>``, ...) as an outcome."""
    kind, _, service = outcome.partition(":")
    reasons = {
        "done": "training reached its end (run.max_steps, or the task sets ran out)",
        "failed": f"service {service} failed (logs/{service}.log)",
        "stalled": stall_message or "no training progress",
        "interrupted": "stopped by Ctrl-C (or SIGTERM to the launcher)",
        "timeout": "ran past --timeout",
    }
    return RunOutcome(kind, reasons.get(kind, outcome))


def read_outcome(run_dir: Path) -> RunOutcome | None:
    """The outcome of a finished run, or None (running, or ended before outcomes were kept)."""
    try:
        body = json.loads((Path(run_dir) / FILE).read_text())
        return RunOutcome(**body)
    except (OSError, ValueError, TypeError):
        return None
