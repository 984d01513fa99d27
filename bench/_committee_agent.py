"""The multi-LoRA bench's N-agent episode, as an ``openai_agent`` workflow: every agent (a workflow
role, served by its own policy) answers the task's arithmetic question; each is rewarded for its
own answer. Nothing here imports AstraFlow: the agents are plain OpenAI SDK calls to the node."""

from __future__ import annotations

import asyncio

from openai import AsyncOpenAI


async def _committee(client: AsyncOpenAI, task: dict, roles: list[str]) -> dict[str, float]:
    async def answer(role: str) -> float:
        reply = await client.chat.completions.create(
            model=role, messages=[{"role": "user", "content": task["question"]}]
        )
        return float((reply.choices[0].message.content or "").strip() == task["answer"])

    rewards = await asyncio.gather(*(answer(role) for role in roles))
    return dict(zip(roles, rewards, strict=True))


async def committee2(client: AsyncOpenAI, task: dict) -> dict[str, float]:
    return await _committee(client, task, ["a0", "a1"])


async def committee4(client: AsyncOpenAI, task: dict) -> dict[str, float]:
    return await _committee(client, task, ["a0", "a1", "a2", "a3"])
