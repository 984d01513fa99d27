"""One plain sentence for how a run's services ended, instead of raw exit codes.

``{'node-0': -15}`` tells a person nothing; "all 4 services stopped cleanly" or "node-0 exited
with status 1 (see logs/node-0.log)" does. SIGTERM from the launcher is a clean stop, a SIGKILL
after the stop timeout is named, and any other status points at the service's log.
"""

from __future__ import annotations

import signal


def describe_exit(code: int | None, killed: bool = False) -> str | None:
    """None for a clean stop (status 0, or the launcher's own SIGTERM), else what happened."""
    if killed:
        return "did not stop within its timeout and was killed (SIGKILL)"
    if code is None or code == 0 or code == -signal.SIGTERM:
        return None
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"was ended by {name}"
    return f"exited with status {code}"


def exit_summary(codes: dict[str, int | None], killed: set[str] | None = None) -> str:
    """``"all 3 services stopped cleanly"``, or the services that did not, each with its log."""
    killed = killed or set()
    bad = []
    for name, code in codes.items():
        what = describe_exit(code, name in killed)
        if what:
            bad.append(f"{name} {what} (logs/{name}.log)")
    if not bad:
        n = len(codes)
        return f"all {n} service{'s' if n != 1 else ''} stopped cleanly"
    return "; ".join(bad)
