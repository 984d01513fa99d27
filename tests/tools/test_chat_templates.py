"""Tools through chat templates: Qwen2.5's published template (tests/tools/qwen25_template.jinja)
renders them natively, the built-in tiny template gets the hermes-style default; either way the
parser reads back what the template writes, and a conversation rendered turn by turn (what the
workflows append) is the same text as rendered whole."""

from __future__ import annotations

from pathlib import Path

import pytest

from astraflow.models.tokenizer import build_tokenizer
from astraflow.rollout.workflows.tokens import ChatRenderer
from astraflow.tools.calls import ToolCall
from astraflow.tools.chat import forced_call_prefix, render_chat, renders_tools
from astraflow.tools.parsers import get_tool_parser

QWEN25 = (Path(__file__).parent / "qwen25_template.jinja").read_text()
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
CALL = ToolCall("calculator", {"expression": "123*456"}, "call_1")
USER = {"role": "user", "content": "What is 123*456?"}
ASSISTANT = {"role": "assistant", "content": None, "tool_calls": [CALL.to_openai()]}
TOOL = {"role": "tool", "tool_call_id": "call_1", "content": "56088"}


def qwen_tokenizer():
    tok = build_tokenizer()
    tok.chat_template = QWEN25
    return tok


@pytest.fixture(params=["qwen25", "tiny"])
def tok(request):
    return qwen_tokenizer() if request.param == "qwen25" else build_tokenizer()


def test_qwen25_renders_tools_natively_and_auto_picks_hermes():
    tok = qwen_tokenizer()
    assert renders_tools(tok) and not renders_tools(build_tokenizer())
    text = render_chat(tok, [USER], tools=[CALC])
    assert "# Tools" in text and '"name": "calculator"' in text
    assert get_tool_parser("auto", tok).name == "hermes"


def test_the_parser_reads_back_the_call_the_template_writes(tok):
    before = render_chat(tok, [USER], tools=[CALC])
    after = render_chat(tok, [USER, ASSISTANT], tools=[CALC], add_generation_prompt=False)
    written = after[len(before) :]  # what a model of this template generates for the call
    turn = get_tool_parser("hermes").parse(written.split("<|im_end|>")[0].split("<|end|>")[0])
    assert turn.valid and [(c.name, c.arguments) for c in turn.calls] == [
        ("calculator", {"expression": "123*456"})
    ]


def test_turn_by_turn_ids_equal_the_conversation_rendered_whole(tok):
    renderer = ChatRenderer(tok, tools=[CALC])
    whole = render_chat(tok, [USER], tools=[CALC])
    full = render_chat(tok, [USER, ASSISTANT, TOOL], tools=[CALC])
    generated_text = render_chat(tok, [USER, ASSISTANT], tools=[CALC], add_generation_prompt=False)
    generated_text = generated_text[len(whole) :]
    end = "<|im_end|>" if "<|im_end|>" in generated_text else "<|end|>"
    generated = tok.encode(generated_text.split(end)[0], add_special_tokens=False)
    ids = (
        renderer.prompt_ids(USER["content"]) + generated + renderer.messages_ids([TOOL], generated)
    )
    assert tok.decode(ids) == full


def test_a_forced_call_prefix_is_how_the_template_starts_the_call():
    parser = get_tool_parser("hermes")
    assert forced_call_prefix(parser, [CALC], "calculator") == (
        '<tool_call>\n{"name": "calculator", "arguments": '
    )
    clock = {"type": "function", "function": {"name": "now", "parameters": {"type": "object"}}}
    whole = forced_call_prefix(parser, [CALC, clock], "now")
    assert get_tool_parser("hermes").parse(whole).calls[0].name == "now"
    assert forced_call_prefix(parser, [CALC, clock], "required") == '<tool_call>\n{"name": '
    assert forced_call_prefix(parser, [CALC], "auto") == ""
    with pytest.raises(ValueError, match="not a tool"):
        forced_call_prefix(parser, [CALC], "sqrt")
