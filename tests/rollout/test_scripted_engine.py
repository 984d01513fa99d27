"""The scripted engine (how the AgentBench oracle speaks), its byte tokenizer, and the sliding
window that `--overflow truncate` puts in front of small-context models."""

from __future__ import annotations

import asyncio

from astraflow.protocol import Task
from astraflow.rollout.engines.base import Generation, SamplingParams
from astraflow.rollout.engines.byte_tokenizer import ByteTokenizer, last_message
from astraflow.rollout.engines.scripted import ScriptedEngine
from astraflow.rollout.engines.window import SlidingWindowEngine
from astraflow.rollout.workflows.base import RolePolicy
from astraflow.rollout.workflows.single_agent import single_agent
from astraflow.rollout.workflows.tokens import ChatRenderer


def test_byte_tokenizer_is_lossless_and_renders_chatml():
    tok = ByteTokenizer()
    text = "SELECT `städte` FROM t WHERE name = 'Ōsaka'; -- ✓"
    assert tok.decode(tok.encode(text)) == text
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True
    )
    assert prompt == f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"
    assert last_message(prompt) == text and last_message(prompt, "system") is None
    assert tok.decode([*tok.encode("a"), tok.eos_token_id], skip_special_tokens=True) == "a"


class _Echo:
    """A two-turn env: observation 'first', then the agent's reply echoed; ends on 'stop'."""

    async def reset(self, seed=None, options=None):
        return "first", {}

    async def step(self, action):
        done = action == "stop"
        return f"you said {action}", float(done), done, False, {"success": done}

    async def close(self):
        return None


def test_scripted_engine_answers_the_latest_observation_through_single_agent():
    seen: list[str] = []

    def script(obs: str) -> str:
        seen.append(obs)
        return "stop" if len(seen) == 2 else "go"

    engine = ScriptedEngine(script)
    policy = RolePolicy("s", engine, SamplingParams(temperature=0.0, max_tokens=64), False)

    async def make_env(env_id, kwargs):
        return _Echo()

    task = Task(env="echo")
    episode = asyncio.run(single_agent(task, {"agent": policy}, make_env, max_turns=4))
    assert seen == ["first", "you said go"]
    assert episode.finish_reason == "terminated" and episode.rewards == {"agent": 1.0}
    (traj,) = episode.trajectories
    # the token sequence is what ChatRenderer built, the generated parts are the script's replies
    renderer = ChatRenderer(engine.tokenizer)
    assert traj.tokens[: traj.prompt_length] == renderer.prompt_ids("first")
    assert engine.tokenizer.decode(traj.tokens).endswith("stop<|im_end|>")


def test_scripted_engine_cuts_replies_at_max_tokens():
    engine = ScriptedEngine(lambda obs: "abcdef")
    prompt = engine.tokenizer.apply_chat_template(
        [{"role": "user", "content": "q"}], tokenize=True, add_generation_prompt=True
    )
    (gen,) = asyncio.run(engine.generate(prompt, SamplingParams(max_tokens=3)))
    assert gen.token_ids == list(b"abc") and gen.finish_reason == "length"
    (gen,) = asyncio.run(engine.generate(prompt, SamplingParams(max_tokens=10)))
    assert gen.token_ids == [*b"abcdef", 256] and gen.finish_reason == "stop"


class _Recorder:
    max_context = 10
    version = 3
    tokenizer = ByteTokenizer()

    def __init__(self):
        self.prompts: list[tuple[list[int], int]] = []

    async def generate(self, prompt_ids, params):
        self.prompts.append((list(prompt_ids), params.max_tokens))
        return [Generation([1], [0.0], "stop", self.version)]


def test_sliding_window_keeps_the_latest_tokens_that_fit():
    inner = _Recorder()
    engine = SlidingWindowEngine(inner, reserve=4)
    asyncio.run(engine.generate(list(range(5)), SamplingParams(max_tokens=8)))
    asyncio.run(engine.generate(list(range(20)), SamplingParams(max_tokens=8)))
    assert inner.prompts[0] == (list(range(5)), 4)  # fits: unchanged, max_tokens clipped to room
    assert inner.prompts[1] == (list(range(14, 20)), 3)  # last 10 - 4 tokens, room for 3 more
    assert engine.version == 3 and engine.max_context > 1 << 20
