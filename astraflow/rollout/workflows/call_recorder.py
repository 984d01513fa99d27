"""Turn one episode's OpenAI API calls into per-role token trajectories.

Why this shape: a trainer needs, per role, ONE token sequence with the behaviour log-probs and weight
version of every generated token, and the dataflow service takes one trajectory per role per
episode. Agent code speaks text (chat messages), so each call would be re-rendered and re-tokenized
from text, which drifts from the ids actually generated. Instead the calls made under one model
name must form one conversation: each call resends the earlier messages and the replies it got,
unchanged, and adds new ones. The recorder then reuses the exact ids of the conversation so far
(prompt, generated ids, and the context rendered once) and renders only the new messages, the same
way ``single_agent`` grows its sequence. A call that does not continue its model's conversation is
refused (HTTP 400, message says why): a separate conversation belongs under another model name,
declared as another role (roles may map to the same policy).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from astraflow.protocol import Trajectory
from astraflow.rollout.engines.base import Generation
from astraflow.rollout.engines.openai_server import CallRejected
from astraflow.rollout.workflows.base import RolePolicy
from astraflow.rollout.workflows.single_agent import TurnRecorder
from astraflow.rollout.workflows.tokens import ChatRenderer


@dataclass
class _Conversation:
    """One role's sequence so far and what the agent saw of it."""

    kind: str  # "chat" | "completions"
    rec: TurnRecorder
    #: chat: the messages of the last call plus the reply it got, as the client received them
    messages: list[dict[str, str]] = field(default_factory=list)
    #: completions: the last prompt text plus the returned text (None after a token-ids prompt)
    text: str | None = None
    last_generated: list[int] = field(default_factory=list)


def _same(a: list[dict[str, str]], b: list[dict[str, str]]) -> bool:
    return len(a) == len(b) and all(
        x["role"] == y["role"] and x["content"] == y["content"] for x, y in zip(a, b, strict=True)
    )


class EpisodeCalls:
    """The :class:`~astraflow.rollout.engines.openai_server.CallRecorder` of one episode."""

    def __init__(self, policies: Mapping[str, RolePolicy], max_total_tokens: int = 4096):
        self.policies = policies
        self.max_total_tokens = max_total_tokens
        self._conversations: dict[str, _Conversation] = {}
        #: completions: the prompt text of the call under way, per model (None: token ids)
        self._prompt_text: dict[str, str | None] = {}
        self.calls = 0
        self.generated_tokens = 0

    # -------------------------------------------------------------- CallRecorder
    def chat_prompt(
        self, model: str, messages: list[dict[str, str]], rendered: list[int]
    ) -> list[int]:
        conv = self._conversations.get(model)
        if conv is None:
            return self._within_budget(model, rendered)
        if conv.kind != "chat":
            raise CallRejected(
                f"model {model!r} was used with /v1/completions earlier in this episode; one model "
                "name is one conversation (use another model name, declared as a role)"
            )
        known = conv.messages
        if len(messages) <= len(known) or not _same(messages[: len(known)], known):
            raise CallRejected(
                f"this call to model {model!r} does not continue the conversation of its earlier "
                f"calls in this episode: send the {len(known)} earlier message(s) and replies "
                "unchanged, then the new ones. A separate conversation belongs under another "
                "model name, declared as a role in workflow.roles"
            )
        new = messages[len(known) :]
        renderer = ChatRenderer(self.policies[model].tokenizer)
        ids = conv.rec.tokens + renderer.messages_ids(new, conv.last_generated)
        return self._within_budget(model, ids)

    def completion_prompt(
        self, model: str, prompt: str | list[int], encoded: list[int]
    ) -> list[int]:
        self._prompt_text[model] = prompt if isinstance(prompt, str) else None
        conv = self._conversations.get(model)
        if conv is None:
            return self._within_budget(model, encoded)
        if conv.kind != "completions":
            raise CallRejected(
                f"model {model!r} was used with /v1/chat/completions earlier in this episode; "
                "one model name is one conversation (use another model name, declared as a role)"
            )
        if isinstance(prompt, list):
            if prompt[: len(conv.rec.tokens)] != conv.rec.tokens:
                raise CallRejected(
                    f"this call to model {model!r} does not extend the token ids of its earlier "
                    "calls in this episode (prompt + generated ids so far)"
                )
            return self._within_budget(model, list(prompt))
        if conv.text is None or not prompt.startswith(conv.text):
            raise CallRejected(
                f"this call to model {model!r} does not extend the text of its earlier calls in "
                "this episode (the previous prompt followed by the returned text)"
            )
        tok = self.policies[model].tokenizer
        suffix = tok.encode(prompt[len(conv.text) :], add_special_tokens=False)
        return self._within_budget(model, conv.rec.tokens + suffix)

    def record(
        self,
        model: str,
        prompt_ids: list[int],
        gen: Generation,
        text: str,
        messages: list[dict[str, str]] | None,
    ) -> None:
        conv = self._conversations.get(model)
        if conv is None:
            conv = _Conversation(
                "chat" if messages is not None else "completions", TurnRecorder(model, prompt_ids)
            )
            self._conversations[model] = conv
        else:
            if prompt_ids[: len(conv.rec.tokens)] != conv.rec.tokens:
                raise CallRejected(
                    f"two calls to model {model!r} ran at once in this episode; calls under one "
                    "model name are one conversation and must be made one after the other"
                )
            conv.rec.add_context(prompt_ids[len(conv.rec.tokens) :])
        conv.rec.add_generated(gen.token_ids, gen.logprobs, gen.version)
        conv.last_generated = list(gen.token_ids)
        if messages is not None:
            conv.messages = [*messages, {"role": "assistant", "content": text}]
        else:
            prompt_text = self._prompt_text.pop(model, None)
            conv.text = None if prompt_text is None else prompt_text + text
        self.calls += 1
        self.generated_tokens += len(gen.token_ids)

    # -------------------------------------------------------------- results
    def roles(self) -> list[str]:
        return list(self._conversations)

    def trajectories(self) -> list[Trajectory]:
        return [c.rec.trajectory() for c in self._conversations.values()]

    def _within_budget(self, model: str, ids: list[int]) -> list[int]:
        if len(ids) >= self.max_total_tokens:
            raise CallRejected(
                f"model {model!r}: the conversation reached {len(ids)} tokens, at or past this "
                f"episode's budget of {self.max_total_tokens} (workflow.kwargs.max_total_tokens)"
            )
        return ids
