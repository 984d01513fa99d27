"""An engine that speaks a fixed list of replies (tool calls, answers), one per generation, and
keeps every prompt it was given: the OpenAI surface and the tool loop are checked on exact,
known model outputs, through the real tokenizer path (a byte-level ChatML tokenizer)."""

from __future__ import annotations

from astraflow.rollout.engines.base import Generation, SamplingParams
from astraflow.rollout.engines.byte_tokenizer import ByteTokenizer


class ReplyEngine:
    max_context = 1 << 30

    def __init__(self, replies: list[str], max_context: int | None = None, tokenizer=None):
        self.tokenizer = tokenizer or ByteTokenizer()
        self.replies = list(replies)
        self.prompts: list[list[int]] = []
        self.version = 3
        if max_context:
            self.max_context = max_context

    async def generate(self, prompt_ids, params: SamplingParams):
        self.prompts.append(list(prompt_ids))
        reply = self.replies.pop(0) if len(self.replies) > 1 else self.replies[0]
        ids = self.tokenizer.encode(reply, add_special_tokens=False) + [self.tokenizer.eos_token_id]
        finish = "stop"
        if len(ids) > params.max_tokens:
            ids, finish = ids[: params.max_tokens], "length"
        return [Generation(ids, [-0.5] * len(ids), finish, self.version) for _ in range(params.n)]

    async def load_weights(self, update) -> None:
        raise NotImplementedError

    async def close(self):
        return None
