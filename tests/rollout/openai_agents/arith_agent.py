"""Agents written only against the official ``openai`` SDK: nothing here imports AstraFlow.

``solve`` is what a user would write for the arithmetic task set; the others exercise the
``openai_agent`` workflow's contract (several turns, several roles, env access, misuse).
"""

from __future__ import annotations

from openai import AsyncOpenAI


async def solve(client: AsyncOpenAI, task: dict) -> str:
    """One chat call; the reply is the final answer, which the task's env scores."""
    reply = await client.chat.completions.create(
        model="agent", messages=[{"role": "user", "content": task["question"]}]
    )
    return reply.choices[0].message.content


async def retry_once(client: AsyncOpenAI, task: dict) -> str:
    """Two turns of one conversation: answer, then asked again after a user follow-up."""
    messages = [{"role": "user", "content": task["question"]}]
    first = await client.chat.completions.create(model="agent", messages=messages, max_tokens=6)
    messages += [
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": task["question"]},
    ]
    second = await client.chat.completions.create(model="agent", messages=messages, max_tokens=6)
    return second.choices[0].message.content


async def solve_and_check(client: AsyncOpenAI, task: dict) -> dict:
    """Two model names (two roles): a solver answers, a checker says 1 or 0 about it."""
    answer = await client.chat.completions.create(
        model="solver", messages=[{"role": "user", "content": task["question"]}]
    )
    text = answer.choices[0].message.content
    verdict = await client.chat.completions.create(
        model="checker",
        messages=[{"role": "user", "content": f"{task['question']}={text}?"}],
        max_tokens=2,
    )
    correct = text.strip() == task["answer"]
    said_yes = verdict.choices[0].message.content.strip().startswith("1")
    return {"solver": float(correct), "checker": float(said_yes == correct)}


async def with_env(client: AsyncOpenAI, task: dict, env) -> None:
    """Steps the env itself; the rewards it collects are the episode's."""
    reply = await client.chat.completions.create(
        model="agent", messages=[{"role": "user", "content": env.observation}]
    )
    await env.step(reply.choices[0].message.content)


async def rewrites_history(client: AsyncOpenAI, task: dict) -> float:
    """Misuse: the second call drops the first reply, so it is not one conversation."""
    await client.chat.completions.create(
        model="agent", messages=[{"role": "user", "content": task["question"]}]
    )
    await client.chat.completions.create(
        model="agent", messages=[{"role": "user", "content": "1+1"}]
    )
    return 1.0


def not_async(client, task):
    return 1.0


async def complete_twice(client: AsyncOpenAI, task: dict) -> float:
    """The completions API, continuing its own text: prompt, reply, then a second turn."""
    prompt = f"<|user|>{task['question']}<|end|><|assistant|>"
    first = await client.completions.create(model="agent", prompt=prompt, max_tokens=6)
    prompt += first.choices[0].text + f"<|end|><|user|>{task['question']}<|end|><|assistant|>"
    await client.completions.create(model="agent", prompt=prompt, max_tokens=6)
    return 0.5


async def rewarded_turns(client: AsyncOpenAI, task: dict) -> float:
    """AReaL-style per-turn rewards: the first call is rewarded 0.25 by index, the second (the
    latest) 0.5 by default; the returned 1.0 goes to the last call too."""
    messages = [{"role": "user", "content": task["question"]}]
    first = await client.chat.completions.create(model="agent", messages=messages, max_tokens=4)
    messages += [
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": task["question"]},
    ]
    await client.chat.completions.create(model="agent", messages=messages, max_tokens=4)
    client.set_reward(0.25, call=0)
    client.set_reward(0.5)
    return 1.0


async def rewards_a_call_it_never_made(client: AsyncOpenAI, task: dict) -> float:
    """Misuse: a reward for a third call of a model called once."""
    await client.chat.completions.create(
        model="agent", messages=[{"role": "user", "content": task["question"]}], max_tokens=2
    )
    client.set_reward(1.0, call=2)
    return 0.0
