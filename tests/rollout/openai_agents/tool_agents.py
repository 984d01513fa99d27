"""Agents that call tools through the ``openai`` SDK's function calling (no AstraFlow import)."""

from __future__ import annotations

import json

from openai import AsyncOpenAI

CALCULATOR = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string"}},
            "required": ["expression"],
        },
    },
}


def calculator(expression: str) -> str:
    return str(eval(expression, {"__builtins__": {}}))  # noqa: S307 - test input


async def calculate(client: AsyncOpenAI, task: dict) -> str:
    """The usual tool loop: ask, run the calls the model makes, send the results, answer."""
    messages = [{"role": "user", "content": task["question"]}]
    for _ in range(4):
        reply = await client.chat.completions.create(
            model="agent", messages=messages, tools=[CALCULATOR]
        )
        message = reply.choices[0].message
        if not message.tool_calls:
            return message.content
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls:
            args = json.loads(call.function.arguments)
            messages.append(
                {"role": "tool", "tool_call_id": call.id, "content": calculator(**args)}
            )
    return ""


async def rewrites_the_call(client: AsyncOpenAI, task: dict) -> float:
    """Misuse: sends the model's call back with other arguments than it generated."""
    messages = [{"role": "user", "content": task["question"]}]
    reply = await client.chat.completions.create(
        model="agent", messages=messages, tools=[CALCULATOR]
    )
    message = reply.choices[0].message.model_dump(exclude_none=True)
    message["tool_calls"][0]["function"]["arguments"] = json.dumps({"expression": "1+1"})
    call_id = message["tool_calls"][0]["id"]
    messages += [message, {"role": "tool", "tool_call_id": call_id, "content": "2"}]
    await client.chat.completions.create(model="agent", messages=messages, tools=[CALCULATOR])
    return 1.0


async def never_stops(client: AsyncOpenAI, task: dict) -> str:
    """Keeps the conversation going until the model has no room left, then fails on the empty
    reply (as an agent that expects an answer would)."""
    messages = [{"role": "user", "content": task["question"]}]
    while True:
        reply = await client.chat.completions.create(model="agent", messages=messages)
        text = reply.choices[0].message.content
        if reply.choices[0].finish_reason == "length" and not text:
            raise RuntimeError("the model gave no answer")
        messages += [{"role": "assistant", "content": text}, {"role": "user", "content": "again"}]
