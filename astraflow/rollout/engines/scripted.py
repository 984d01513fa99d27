"""An engine whose replies come from a script instead of a model.

Why: to check a harness (envs, data, scoring) through exactly the path a policy takes (workflow,
token sequence, env runner), a known-good agent must speak as an engine. ``ScriptedEngine`` reads the
latest user message (the env's observation) out of the ChatML-rendered prompt, asks its script for
the reply text and returns that text's tokens, as a model would. AgentBench's oracle (reference
solutions) is one such script; tests use others.

One instance serves one episode when the script keeps per-episode state (turn counters); the
evaluation builds one per episode. Log-probs are 0.0 (the script is deterministic) and the version is
fixed: a scripted engine has no weights.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from astraflow.rollout.engines.base import Generation, SamplingParams, WeightUpdate
from astraflow.rollout.engines.byte_tokenizer import ByteTokenizer, last_message


class ScriptedEngine:
    """``script(observation) -> reply``; the reply's tokens end with the tokenizer's EOS token.

    ``tokenizer`` must render ChatML (the default :class:`ByteTokenizer` does, as do Qwen-style
    tokenizers). A reply longer than ``params.max_tokens`` is cut and finishes with ``length``.
    """

    #: A script has no context window; the workflow's token budget is the only bound.
    max_context = 1 << 30

    def __init__(self, script: Callable[[str], str], tokenizer: Any | None = None):
        self.script = script
        self.tokenizer = tokenizer if tokenizer is not None else ByteTokenizer()
        self.version = 0
        self.calls = 0

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> list[Generation]:
        prompt = self.tokenizer.decode(list(prompt_ids), skip_special_tokens=False)
        observation = last_message(prompt, "user")
        if observation is None:
            raise ValueError(
                "ScriptedEngine: the prompt holds no ChatML user message; render prompts with a "
                "ChatML chat template (ByteTokenizer or a Qwen-style tokenizer)"
            )
        self.calls += 1
        ids = self.tokenizer.encode(self.script(observation), add_special_tokens=False)
        ids.append(self.tokenizer.eos_token_id)
        finish = "stop"
        if len(ids) > params.max_tokens:
            ids, finish = ids[: params.max_tokens], "length"
        gen = Generation(list(ids), [0.0] * len(ids), finish, self.version)
        return [gen for _ in range(params.n)]

    async def load_weights(self, update: WeightUpdate) -> None:
        raise NotImplementedError("a scripted engine has no weights to load")

    async def close(self) -> None:
        return None
