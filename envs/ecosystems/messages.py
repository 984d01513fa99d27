"""Chat-message observations (OpenAI format, any role) as the observation text."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any


def messages_text(messages: Iterable[Mapping[str, Any]]) -> str:
    """The messages' contents, one after another (what a text-only consumer reads)."""
    return "\n\n".join(str(m.get("content") or "") for m in messages)
