"""Function calling on the OpenAI-compatible server, driven by the official ``openai`` SDK:
``tools`` rendered into the prompt, ``tool_calls`` back (plain and streamed), ``content: null``
assistant turns and ``tool`` messages accepted, ``tool_choice`` enforced, unsupported fields
refused. The engine speaks known replies so every assertion is about the surface, not a model."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

openai = pytest.importorskip("openai", reason="the openai SDK is in the test extra")

from astraflow.protocol.http_server import HTTPServer  # noqa: E402
from astraflow.rollout.engines.openai_server import create_app  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
from reply_engine import ReplyEngine  # noqa: E402

KEY = "tools-test-key"
CALC = {
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
CLOCK = {
    "type": "function",
    "function": {"name": "now", "description": "The time.", "parameters": {}},
}
CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "123*456"}}\n</tool_call>'
TWO_CALLS = CALL + "\n" + CALL.replace("123*456", "7*8")
USER = {"role": "user", "content": "What is 123*456?"}


@pytest.fixture
def serve():
    servers = []

    def start(replies: list[str]):
        engine = ReplyEngine(replies)
        server = HTTPServer(create_app(engine, "m", KEY, tool_parser="hermes"), lifespan="off")
        server.start_in_thread()
        servers.append(server)
        client = openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0)
        return engine, client

    yield start
    for s in servers:
        s.stop_thread()


def prompt_text(engine, i=-1) -> str:
    return engine.tokenizer.decode(engine.prompts[i])


def test_tools_are_rendered_and_calls_come_back_as_tool_calls(serve):
    engine, client = serve([CALL])
    reply = client.chat.completions.create(model="m", messages=[USER], tools=[CALC])
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.id.startswith("call_") and call.type == "function"
    assert call.function.name == "calculator"
    assert json.loads(call.function.arguments) == {"expression": "123*456"}
    assert "calculator(expression: string): Evaluate an arithmetic expression." in prompt_text(
        engine
    )


def test_streamed_tool_calls_accumulate_to_the_same_calls(serve):
    engine, client = serve([TWO_CALLS])
    stream = client.chat.completions.create(model="m", messages=[USER], tools=[CALC], stream=True)
    calls: dict[int, dict] = {}
    finish = None
    for chunk in stream:
        choice = chunk.choices[0]
        finish = choice.finish_reason or finish
        for delta in choice.delta.tool_calls or []:
            entry = calls.setdefault(delta.index, {"id": None, "name": "", "arguments": ""})
            entry["id"] = delta.id or entry["id"]
            entry["name"] += (delta.function.name or "") if delta.function else ""
            entry["arguments"] += (delta.function.arguments or "") if delta.function else ""
    assert finish == "tool_calls"
    assert [json.loads(c["arguments"]) for c in calls.values()] == [
        {"expression": "123*456"},
        {"expression": "7*8"},
    ]
    assert all(c["id"].startswith("call_") and c["name"] == "calculator" for c in calls.values())


def test_content_null_assistant_and_tool_messages_are_accepted_and_rendered(serve):
    engine, client = serve(["56088"])
    history = [
        USER,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "calculator", "arguments": '{"expression": "123*456"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "56088"},
    ]
    reply = client.chat.completions.create(model="m", messages=history, tools=[CALC])
    assert reply.choices[0].message.content == "56088"
    assert reply.choices[0].finish_reason == "stop" and not reply.choices[0].message.tool_calls
    text = prompt_text(engine)
    assert CALL in text and "<|im_start|>tool\n56088<|im_end|>" in text


def test_tool_choice_none_keeps_the_tools_in_the_prompt_and_reads_no_calls(serve):
    engine, client = serve([CALL])
    reply = client.chat.completions.create(
        model="m", messages=[USER], tools=[CALC], tool_choice="none"
    )
    message = reply.choices[0].message
    assert message.tool_calls is None and "<tool_call>" in message.content
    assert reply.choices[0].finish_reason == "stop"
    assert "calculator(expression: string)" in prompt_text(engine)


def test_reasoning_comes_back_beside_the_call(serve):
    _, client = serve(["<think>\nuse the tool\n</think>\n\n" + CALL])
    reply = client.chat.completions.create(model="m", messages=[USER], tools=[CALC])
    message = reply.choices[0].message
    assert message.reasoning_content == "use the tool" and message.tool_calls


def test_a_named_tool_choice_is_prefilled_and_a_parameterless_one_given_whole(serve):
    engine, client = serve(['{"expression": "123*456"}}\n</tool_call>', ""])
    choice = {"type": "function", "function": {"name": "calculator"}}
    reply = client.chat.completions.create(
        model="m", messages=[USER], tools=[CALC], tool_choice=choice
    )
    assert prompt_text(engine).endswith('<tool_call>\n{"name": "calculator", "arguments": ')
    # the model wrote the rest of the call: the reply is the prefill plus what it wrote
    (call,) = reply.choices[0].message.tool_calls
    assert json.loads(call.function.arguments) == {"expression": "123*456"}
    engine.replies = [""]
    choice = {"type": "function", "function": {"name": "now"}}
    reply = client.chat.completions.create(
        model="m", messages=[USER], tools=[CALC, CLOCK], tool_choice=choice
    )
    (call,) = reply.choices[0].message.tool_calls
    assert (call.function.name, call.function.arguments) == ("now", "{}")
    assert reply.choices[0].finish_reason == "tool_calls"


def test_parallel_tool_calls_false_returns_the_first_call(serve):
    _, client = serve([TWO_CALLS])
    reply = client.chat.completions.create(
        model="m", messages=[USER], tools=[CALC], parallel_tool_calls=False
    )
    assert len(reply.choices[0].message.tool_calls) == 1


def test_a_malformed_call_comes_back_as_the_text_the_model_wrote(serve):
    _, client = serve(['<tool_call>\n{"name": "calculator", "arguments": {'])
    reply = client.chat.completions.create(model="m", messages=[USER], tools=[CALC])
    assert reply.choices[0].message.tool_calls is None
    assert reply.choices[0].message.content.startswith("<tool_call>")


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"frequency_penalty": 0.5, "logit_bias": {"1": 5}}, "logit_bias, frequency_penalty"),
        (
            {"tools": [CALC], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "'nope'",
        ),
        ({"tool_choice": "required"}, "needs `tools`"),
        ({"extra_body": {"functions": [CALC["function"]]}}, "functions"),
    ],
)
def test_requests_the_server_cannot_honour_get_a_clear_400(serve, kwargs, words):
    _, client = serve(["x"])
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="m", messages=[USER], **kwargs)
    assert words in err.value.message


@pytest.mark.parametrize(
    "message, words",
    [
        ({"role": "tool", "content": "3"}, "tool_call_id"),
        ({"role": "user", "content": None}, "needs content"),
        ({"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}, "text"),
    ],
)
def test_malformed_messages_are_refused_naming_the_problem(serve, message, words):
    _, client = serve(["x"])
    with pytest.raises(openai.UnprocessableEntityError) as err:
        client.chat.completions.create(model="m", messages=[USER, message])
    assert words in err.value.message


def test_text_parts_and_unused_fields_are_accepted(serve):
    _, client = serve(["ok"])
    parts = {
        "role": "user",
        "content": [{"type": "text", "text": "What is "}, {"type": "text", "text": "1?"}],
    }
    reply = client.chat.completions.create(
        model="m", messages=[parts], user="u1", metadata={"k": "v"}, frequency_penalty=0
    )
    assert reply.choices[0].message.content == "ok"
