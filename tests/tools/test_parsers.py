"""Tool-call parsers on the text the models' published chat templates teach them to write.

Each string is what the family's template renders for an assistant turn with ``tool_calls``
(after the generation prompt), i.e. what a model of that family generates."""

from __future__ import annotations

import pytest

from astraflow.models.tokenizer import build_tokenizer
from astraflow.tools.calls import ToolCall
from astraflow.tools.parsers import (
    BUILTIN_PARSERS,
    UnknownToolParserError,
    get_tool_parser,
    parser_for_template,
    tool_parsers,
    turn_text,
)

# Qwen2.5-Instruct: '<|im_start|>assistant\n' + content + '\n<tool_call>\n{"name": "' + name +
# '", "arguments": ' + arguments|tojson + '}\n</tool_call>' per call, then '<|im_end|>'.
QWEN25_TWO_CALLS = (
    "Let me check both cities.\n<tool_call>\n"
    '{"name": "get_current_temperature", "arguments": {"location": "Paris, France", "unit": "celsius"}}'
    "\n</tool_call>\n<tool_call>\n"
    '{"name": "get_current_temperature", "arguments": {"location": "Berlin, Germany"}}'
    "\n</tool_call>"
)
# Qwen3 in thinking mode: the turn opens with its reasoning.
QWEN3_THINKING = (
    "<think>\nThe user wants the weather; I should call the tool.\n</think>\n\n"
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
)
# Llama 3.1/3.2 JSON tool calling ('{"name": "' + name + '", "parameters": ' + args|tojson + '}').
LLAMA3 = '{"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}}'
# Mistral-7B-Instruct-v0.3: '[TOOL_CALLS] [' + calls as JSON + ']'.
MISTRAL_V3 = (
    '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "a1b2c3d4e"}, '
    '{"name": "get_time", "arguments": {"tz": "CET"}, "id": "f5g6h7i8j"}]'
)
# Mistral Small 3.2 / Magistral (v11 tokenizer): '[TOOL_CALLS]' + name + '[ARGS]' + args JSON.
MISTRAL_V11 = (
    '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_time[ARGS]{"tz": "CET"}'
)
# Llama 4 / Llama 3.2 pythonic: a Python list of calls.
PYTHONIC = "[get_weather(city=\"Paris\", days=3), get_time(tz='CET')]"
LLAMA4_PYTHONIC = "<|python_start|>[get_weather(city='Paris')]<|python_end|>"


def test_hermes_reads_qwen25_parallel_calls_and_their_content():
    turn = get_tool_parser("hermes").parse(QWEN25_TWO_CALLS)
    assert turn.valid and turn.content == "Let me check both cities."
    assert [(c.name, c.arguments) for c in turn.calls] == [
        ("get_current_temperature", {"location": "Paris, France", "unit": "celsius"}),
        ("get_current_temperature", {"location": "Berlin, Germany"}),
    ]
    assert len({c.id for c in turn.calls}) == 2 and all(
        c.id.startswith("call_") for c in turn.calls
    )


def test_hermes_splits_qwen3_reasoning_from_the_call():
    turn = get_tool_parser("hermes").parse(QWEN3_THINKING)
    assert turn.reasoning == "The user wants the weather; I should call the tool."
    assert turn.content == "" and turn.calls[0].arguments == {"city": "Paris"}


def test_hermes_plain_answer_has_no_calls():
    turn = get_tool_parser("hermes").parse("The answer is 42.")
    assert turn.valid and turn.calls == () and turn.content == "The answer is 42."


@pytest.mark.parametrize(
    "text, reason",
    [
        ('<tool_call>\n{"name": "f", "arguments": {"x": 1', "not closed"),
        ('<tool_call>\n{"name": "f", "arguments": {"x": 1}\n</tool_call>', "one JSON object"),
        ('<tool_call>\n{"arguments": {}}\n</tool_call>', "'name'"),
        ('<tool_call>\n{"name": "f", "arguments": [1]}\n</tool_call>', "JSON object"),
        ("<tool_call>\ncalculator(1+2)\n</tool_call>", "one JSON object"),
    ],
)
def test_hermes_malformed_calls_are_an_outcome_not_an_exception(text, reason):
    turn = get_tool_parser("hermes").parse(text)
    assert not turn.valid and reason in turn.error


def test_hermes_keeps_the_good_call_of_a_turn_with_a_bad_one():
    text = (
        '<tool_call>\n{"name": "ok", "arguments": {}}\n</tool_call><tool_call>\n{bad}\n</tool_call>'
    )
    turn = get_tool_parser("hermes").parse(text)
    assert not turn.valid and [c.name for c in turn.calls] == ["ok"]


def test_hermes_accepts_arguments_given_as_a_json_string():
    text = '<tool_call>\n{"name": "f", "arguments": "{\\"x\\": 2}"}\n</tool_call>'
    assert get_tool_parser("hermes").parse(text).calls[0].arguments == {"x": 2}


def test_llama3_json():
    p = get_tool_parser("llama3_json")
    turn = p.parse(LLAMA3)
    assert turn.valid and turn.calls[0].arguments == {"city": "Paris", "unit": "celsius"}
    two = p.parse("<|python_tag|>" + LLAMA3 + "; " + '{"name": "g", "parameters": {}}')
    assert [c.name for c in two.calls] == ["get_weather", "g"]
    assert p.parse("Paris is sunny.").content == "Paris is sunny."
    bad = p.parse('{"name": "get_weather", "parameters": {"city": ')
    assert not bad.valid and "does not parse" in bad.error


def test_mistral_v3_and_v11():
    p = get_tool_parser("mistral")
    v3 = p.parse(MISTRAL_V3)
    assert [(c.name, c.id) for c in v3.calls] == [
        ("get_weather", "a1b2c3d4e"),
        ("get_time", "f5g6h7i8j"),
    ]
    v11 = p.parse(MISTRAL_V11)
    assert [(c.name, c.arguments) for c in v11.calls] == [
        ("get_weather", {"city": "Paris"}),
        ("get_time", {"tz": "CET"}),
    ]
    assert p.parse("Bonjour.").content == "Bonjour."
    assert not p.parse('[TOOL_CALLS] [{"name": "x", "arguments": ').valid


def test_pythonic():
    p = get_tool_parser("pythonic")
    turn = p.parse(PYTHONIC)
    assert [(c.name, c.arguments) for c in turn.calls] == [
        ("get_weather", {"city": "Paris", "days": 3}),
        ("get_time", {"tz": "CET"}),
    ]
    assert p.parse(LLAMA4_PYTHONIC).calls[0].arguments == {"city": "Paris"}
    assert p.parse("[1, 2] is a list.").calls == ()
    bad = p.parse("[get_weather(city=os.getcwd())]")
    assert not bad.valid and "literals" in bad.error
    assert not p.parse("[get_weather(city='Paris'").valid


@pytest.mark.parametrize("parser", BUILTIN_PARSERS, ids=lambda p: p.name)
def test_every_parser_reads_back_what_it_writes(parser):
    calls = [
        ToolCall("search", {"query": 'bm25 "ranking"', "k": 3}),
        ToolCall("open", {"doc_id": 7}),
    ]
    turn = parser.parse(parser.format_calls(calls))
    assert turn.valid and [(c.name, c.arguments) for c in turn.calls] == [
        (c.name, c.arguments) for c in calls
    ]
    args = "doc_id=7" if parser.name == "pythonic" else '{"doc_id": 7}'
    opened = parser.call_opening("open") + args + parser.call_closing()
    assert [(c.name, c.arguments) for c in parser.parse(opened).calls] == [("open", {"doc_id": 7})]


def test_auto_reads_the_family_from_the_chat_template():
    assert parser_for_template("... <tool_call>\\n{{ tool_call | tojson }} ...") == "hermes"
    assert parser_for_template("{{ '[TOOL_CALLS] [' }}") == "mistral"
    assert parser_for_template('{"name": function name, "parameters": dictionary}') == "llama3_json"
    assert parser_for_template("<|python_start|>") == "pythonic"
    # a template that says nothing of tools gets AstraFlow's hermes-style rendering
    assert get_tool_parser("auto", build_tokenizer()).name == "hermes"


def test_unknown_parser_name_suggests_close_ones():
    with pytest.raises(UnknownToolParserError, match=r"did you mean hermes\?.*known: hermes"):
        get_tool_parser("hermse")


def test_registry_holds_the_builtins_without_an_install():
    assert tool_parsers().names() == ["hermes", "llama3_json", "mistral", "pythonic"]


def test_turn_text_keeps_the_parsers_markers_and_drops_other_special_tokens():
    from tokenizers import AddedToken

    tok = build_tokenizer()
    tok.add_special_tokens(
        {"additional_special_tokens": [AddedToken("[TOOL_CALLS]", special=True)]}
    )
    ids = tok.encode('[TOOL_CALLS] [{"name": "f", "arguments": {}}]', add_special_tokens=False)
    ids.append(tok.eos_token_id)
    text = turn_text(tok, ids, get_tool_parser("mistral"))
    assert text == '[TOOL_CALLS] [{"name": "f", "arguments": {}}]'
    assert get_tool_parser("mistral").parse(text).calls[0].name == "f"


def test_recipe_names_a_policys_parser_and_unknown_names_are_refused():
    from pydantic import ValidationError

    from astraflow.recipe.schema import PolicyConfig

    assert PolicyConfig(model="builtin:tiny-arith").tool_parser == "auto"
    assert PolicyConfig(model="m", tool_parser="mistral").tool_parser == "mistral"
    with pytest.raises(
        ValidationError, match=r"unknown tool parser 'llama3'; did you mean llama3_json"
    ):
        PolicyConfig(model="m", tool_parser="llama3")
