"""Requests refused at the door, counted by reason, for /status (``refused``).

Why: a refused push stores nothing (validation happens before anything is stored), so without a
count a poisoning node would be invisible. Keys are ``"STATUS METHOD /route: field"`` with
indices folded to ``*`` (``422 POST /trajectories: episodes.*.trajectories.*.tokens``), and there
are at most :data:`MAX_REASONS` of them, so the count stays bounded whatever callers send.
"""

from __future__ import annotations

import re
from collections import Counter

#: Distinct reasons kept; later new ones are counted under "other".
MAX_REASONS = 256
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

    def snapshot(self) -> dict[str, int]:
        return dict(self._counts)
