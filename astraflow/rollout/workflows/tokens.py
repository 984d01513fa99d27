"""Growing one token sequence across turns without re-tokenizing history.

Each turn appends the tokens the engine generated (exactly as generated) and then the environment's
observation rendered once by the chat template. Re-rendering the whole conversation from text would
drift from the generated ids and break the behaviour log-probs the trainer relies on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from astraflow.tools.chat import render_chat

_PROBE = "\u2063PROBE\u2063"


@dataclass
class ChatRenderer:
    """Renders the turn boundaries of a tokenizer's chat template as token ids.

    ``tools`` (OpenAI ``tools`` entries) are offered to the model in every rendering, so the
    pieces rendered turn by turn agree with the conversation rendered whole
    (:func:`astraflow.tools.chat.render_chat`)."""

    tokenizer: Any
    system: str | None = None
    tools: list[dict[str, Any]] | None = None
    _after_assistant: str | None = field(default=None, init=False)

    def _render(self, messages: list[dict[str, Any]], add_generation_prompt: bool) -> str:
        return render_chat(
            self.tokenizer,
            messages,
            tools=self.tools,
            add_generation_prompt=add_generation_prompt,
        )

    def _base(self) -> list[dict[str, str]]:
        return [{"role": "system", "content": self.system}] if self.system else []

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def prompt_ids(
        self, first_observation: str, messages: list[dict[str, str]] | None = None
    ) -> list[int]:
        """Ids of the conversation start up to the assistant's first generation.

        ``messages``: an env's opening as chat turns (e.g. a benchmark's few-shot dialogue with
        earlier assistant turns, ``info["messages"]`` of its reset), rendered instead of
        ``first_observation`` as one user message; it must end with a user message.
        """
        if messages is None:
            messages = [{"role": "user", "content": first_observation}]
        return self.encode(self._render(self._base() + check_messages(messages), True))

    def after_assistant_text(self) -> str:
        """What the template writes after an assistant message's content (end marker, newline)."""
        if self._after_assistant is None:
            msgs = self._base() + [
                {"role": "user", "content": "x"},
                {"role": "assistant", "content": _PROBE},
            ]
            text = self._render(msgs, False)
            self._after_assistant = text.split(_PROBE, 1)[1] if _PROBE in text else ""
        return self._after_assistant

    def observation_ids(
        self, observation: str, generated_ids: list[int], role: str = "user"
    ) -> list[int]:
        """Ids that close the assistant turn (if the engine did not), add ``observation`` as a new
        message of ``role`` and open the next assistant turn."""
        return self.messages_ids([{"role": role, "content": observation}], generated_ids)

    def messages_ids(self, messages: list[dict[str, Any]], generated_ids: list[int]) -> list[int]:
        """Ids that close the assistant turn (if the engine did not), add ``messages`` (a tool
        result, a user turn, several of them) and open the next assistant turn."""
        tok = self.tokenizer
        closing = self.after_assistant_text()
        eos = tok.eos_token
        if (
            generated_ids
            and eos
            and generated_ids[-1] == tok.eos_token_id
            and closing.startswith(eos)
        ):
            closing = closing[len(eos) :]
        probe = self._base() + [
            {"role": "user", "content": "x"},
            {"role": "assistant", "content": _PROBE},
        ]
        before = self._render(probe, False)
        after = self._render(probe + list(messages), True)
        if after.startswith(before):
            turn = after[len(before) :]
        else:  # template does not render incrementally; fall back to rendering the messages alone
            turn = self._render(list(messages), True)
        return self.encode(closing + turn)


def check_messages(messages: Any) -> list[dict[str, str]]:
    """``messages`` as a chat opening: user/assistant turns with text, ending with a user turn."""
    if not isinstance(messages, list) or not messages:
        raise ValueError(
            f"an env's opening messages must be a non-empty list, got {messages!r:.80}"
        )
    out = []
    for i, m in enumerate(messages):
        if (
            not isinstance(m, dict)
            or m.get("role") not in ("system", "user", "assistant")
            or not isinstance(m.get("content"), str)
        ):
            raise ValueError(
                f"opening message {i} must be {{'role': 'system'|'user'|'assistant', "
                f"'content': str}}, got {m!r:.120}"
            )
        out.append({"role": m["role"], "content": m["content"]})
    if out[-1]["role"] != "user":
        raise ValueError("an env's opening messages must end with a user message")
    return out


#: roles an env's later-turn messages may have (a tool result is a ``tool`` turn)
TURN_ROLES = ("system", "user", "assistant", "tool")


def check_turn_messages(messages: Any) -> list[dict[str, Any]]:
    """An env's observation as chat messages (``info["messages"]`` of a step): any of
    :data:`TURN_ROLES`, text content; a ``tool`` turn keeps its ``tool_call_id`` and ``name``."""
    if not isinstance(messages, list):
        raise ValueError(f"an env's step messages must be a list, got {messages!r:.80}")
    out = []
    for i, m in enumerate(messages):
        if (
            not isinstance(m, dict)
            or m.get("role") not in TURN_ROLES
            or not isinstance(m.get("content"), str)
        ):
            raise ValueError(
                f"step message {i} must be {{'role': {'|'.join(TURN_ROLES)}, 'content': str}}, "
                f"got {m!r:.120}"
            )
        out.append({k: m[k] for k in ("role", "content", "tool_call_id", "name") if k in m})
    return out
