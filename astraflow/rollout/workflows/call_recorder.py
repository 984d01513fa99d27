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

Tool calls keep this exact: the reply an agent got (its ``tool_calls`` with their ids, or its text)
is what the next call must resend; the ids that produced it are reused, and only the new messages
(the ``tool`` results, a user turn) are rendered, with the same ``tools`` the conversation started
with. A conversation that reaches ``min(max_total_tokens, engine context - 1)`` gets empty replies
that end with ``length`` (nothing generated, nothing refused) and the episode ends ``length``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from astraflow.protocol import Trajectory
from astraflow.rollout.engines.base import Generation
from astraflow.rollout.engines.openai_server import CallRejected
from astraflow.rollout.engines.openai_tools import canonical_message
from astraflow.rollout.workflows.base import RolePolicy, WorkflowError
from astraflow.rollout.workflows.budget import context_limit
from astraflow.rollout.workflows.single_agent import TurnRecorder
from astraflow.rollout.workflows.tokens import ChatRenderer


@dataclass
class _Conversation:
    """One role's sequence so far and what the agent saw of it."""

    kind: str  # "chat" | "completions"
    rec: TurnRecorder
    #: chat: the messages of the last call plus the reply it got, as the client received them
    messages: list[dict[str, Any]] = field(default_factory=list)
    #: chat: the tools the conversation's prompt was rendered with
    tools: list[dict[str, Any]] | None = None
    #: completions: the last prompt text plus the returned text (None after a token-ids prompt)
    text: str | None = None
    last_generated: list[int] = field(default_factory=list)


def _same(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> bool:
    return len(a) == len(b) and all(
        canonical_message(x) == canonical_message(y) for x, y in zip(a, b, strict=True)
    )


class EpisodeCalls:
    """The :class:`~astraflow.rollout.engines.openai_server.CallRecorder` of one episode."""

    def __init__(self, policies: Mapping[str, RolePolicy], max_total_tokens: int = 4096):
        self.policies = policies
        self.max_total_tokens = max_total_tokens
        self._conversations: dict[str, _Conversation] = {}
        #: completions: the prompt text of the call under way, per model (None: token ids)
        self._prompt_text: dict[str, str | None] = {}
        #: chat: the tools of a conversation's first call, until its reply is recorded
        self._pending_tools: dict[str, list[dict[str, Any]] | None] = {}
        self.calls = 0
        self.generated_tokens = 0
        #: a conversation reached its token budget (the episode ends with ``length``)
        self.truncated = False
        self.tool_calls = 0
        #: replies whose tool call did not parse (the episode ends with ``invalid_tool_call``)
        self.invalid_tool_calls = 0
        #: models the agent gave per-call rewards (``set_reward``)
        self.rewarded: set[str] = set()

    # -------------------------------------------------------------- CallRecorder
    def chat_prompt(
        self,
        model: str,
        messages: list[dict[str, Any]],
        rendered: list[int],
        tools: list[dict[str, Any]] | None = None,
    ) -> list[int]:
        conv = self._conversations.get(model)
        if conv is None:
            self._pending_tools[model] = tools
            return rendered
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
        if tools != conv.tools:
            raise CallRejected(
                f"this call to model {model!r} offers other tools than the earlier calls of its "
                "conversation; the tools are part of the prompt already generated from, so keep "
                "them unchanged within a conversation (or use another model name, as a role)"
            )
        new = messages[len(known) :]
        renderer = ChatRenderer(self.policies[model].tokenizer, tools=tools)
        return conv.rec.tokens + renderer.messages_ids(new, conv.last_generated)

    def room(self, model: str, prompt_ids: list[int]) -> int:
        """Tokens this call may generate within the episode's budget and the engine's context."""
        room = self._budget(model) - len(prompt_ids)
        if room <= 0:
            self.truncated = True
        return room

    def _budget(self, model: str) -> int:
        return context_limit(self.policies[model].engine, self.max_total_tokens)

    def completion_prompt(
        self, model: str, prompt: str | list[int], encoded: list[int]
    ) -> list[int]:
        self._prompt_text[model] = prompt if isinstance(prompt, str) else None
        conv = self._conversations.get(model)
        if conv is None:
            return encoded
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
            return list(prompt)
        if conv.text is None or not prompt.startswith(conv.text):
            raise CallRejected(
                f"this call to model {model!r} does not extend the text of its earlier calls in "
                "this episode (the previous prompt followed by the returned text)"
            )
        tok = self.policies[model].tokenizer
        suffix = tok.encode(prompt[len(conv.text) :], add_special_tokens=False)
        return conv.rec.tokens + suffix

    def record(
        self,
        model: str,
        prompt_ids: list[int],
        gen: Generation,
        text: str,
        messages: list[dict[str, Any]] | None,
        reply: dict[str, Any] | None = None,
        turn: Any = None,
    ) -> None:
        conv = self._conversations.get(model)
        if conv is None:
            conv = _Conversation(
                "chat" if messages is not None else "completions", TurnRecorder(model, prompt_ids)
            )
            conv.tools = self._pending_tools.pop(model, None)
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
            conv.messages = [*messages, reply or {"role": "assistant", "content": text}]
            if turn is not None:
                self.invalid_tool_calls += 0 if turn.valid else 1
                self.tool_calls += len((reply or {}).get("tool_calls") or [])
        else:
            prompt_text = self._prompt_text.pop(model, None)
            conv.text = None if prompt_text is None else prompt_text + text
        self.calls += 1
        self.generated_tokens += len(gen.token_ids)
        if gen.finish_reason == "length" and len(conv.rec.tokens) >= self._budget(model):
            self.truncated = True

    # -------------------------------------------------------------- per-call rewards
    def set_reward(self, reward: float, *, call: int = -1, model: str | None = None) -> None:
        """The agent's ``client.set_reward``: ``reward`` for call ``call`` (its index among the
        calls to ``model`` in this episode, negative from the end; default the latest) of
        ``model`` (default: the one model called so far). Rewards of several calls of a model
        become its trajectory's per-turn rewards (``trainer.turn_discount``)."""
        import math

        if isinstance(reward, bool) or not isinstance(reward, int | float):
            raise WorkflowError(f"set_reward: reward must be a number, got {reward!r:.80}")
        if not math.isfinite(reward):
            raise WorkflowError(f"set_reward: reward must be finite, got {reward!r}")
        if model is None:
            if len(self._conversations) != 1:
                raise WorkflowError(
                    "set_reward: name the model (a role) whose call the reward is for: "
                    f"models called so far: {sorted(self._conversations) or 'none'}"
                )
            model = next(iter(self._conversations))
        conv = self._conversations.get(model)
        if conv is None:
            raise WorkflowError(
                f"set_reward: model {model!r} made no call in this episode yet "
                f"(called: {sorted(self._conversations) or 'none'})"
            )
        n = conv.rec.generated_turns
        if not isinstance(call, int) or not -n <= call < n:
            raise WorkflowError(
                f"set_reward: call {call!r} is not one of the {n} call(s) to model {model!r} "
                f"(0..{n - 1}, or negative from the end)"
            )
        conv.rec.add_turn_reward(float(reward), call)
        self.rewarded.add(model)

    # -------------------------------------------------------------- results
    def roles(self) -> list[str]:
        return list(self._conversations)

    def trajectories(self) -> list[Trajectory]:
        return [c.rec.trajectory() for c in self._conversations.values()]

    def with_final_rewards(self, rewards: dict[str, float]) -> dict[str, float]:
        """The episode's reward per role: a role whose calls got rewards (``set_reward``) gets
        its returned reward on its last call and the sum of its calls' rewards as its reward."""
        out = dict(rewards)
        for model in self.rewarded:
            rec = self._conversations[model].rec
            rec.add_turn_reward(out[model], -1)
            out[model] = sum(rec.run_rewards)
        return out
