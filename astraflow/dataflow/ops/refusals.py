"""Requests refused at the door, counted by reason, for /status (``refused``).

Why: a refused push stores nothing (validation happens before anything is stored), so without a
count a poisoning node would be invisible. A push answered ``accepted=false`` (HTTP 200: lease
already done, episode ids already pushed ...) counts too, as ``409 POST /trajectories: FIELD``:
a run whose every push is refused was otherwise invisible to ``/status`` and the stall detector
(issue 48, finding 1). Keys are ``"STATUS METHOD /route: field"`` with
indices folded to ``*`` (``422 POST /trajectories: episodes.*.trajectories.*.tokens``), and there
are at most :data:`MAX_REASONS` of them, so the count stays bounded whatever callers send.
"""

from __future__ import annotations

import re
from collections import Counter

#: Distinct reasons kept; later new ones are counted under "other".
MAX_REASONS = 256
#: Saved episodes (``POST /partials``) discarded because a push of the lease that could resume
#: them was refused (:func:`astraflow.dataflow.ops.ingest.end_refused_lease`). Saves refused at
#: the door are counted as ``422 POST /partials: FIELD`` like every other 4xx.
DISCARDED_SAVES = "discarded saved episodes: a push of their task's lease was refused"
_INDEX = re.compile(r"(?<=\.)\d+(?=\.|$)|^\d+(?=\.)")


def reason_key(status: int, method: str, route: str, fields: list[str]) -> str:
    first = next(iter(fields), None)
    field = _INDEX.sub("*", first) if first is not None else "<body>"
    return f"{status} {method} {route}: {field}"[:300]


class Refusals:
    """In-memory counts (since the service started) of 4xx answers by reason."""

    def __init__(self) -> None:
        self._counts: Counter[str] = Counter()

    def count(self, status: int, method: str, route: str, fields: list[str]) -> None:
        key = reason_key(status, method, route, fields)
        if key not in self._counts and len(self._counts) >= MAX_REASONS:
            key = "other"
        self._counts[key] += 1

    def note(self, key: str, n: int = 1) -> None:
        """Count ``n`` of something refused that is no HTTP answer of its own (a fixed key of
        this module, e.g. :data:`DISCARDED_SAVES`)."""
        if n <= 0:
            return
        if key not in self._counts and len(self._counts) >= MAX_REASONS:
            key = "other"
        self._counts[key] += n

    def snapshot(self) -> dict[str, int]:
        return dict(self._counts)
