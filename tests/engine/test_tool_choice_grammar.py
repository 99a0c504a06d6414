"""tool_choice "required" or a named function: the default model's output, constrained by
the call-block grammar (tandem.serve.tool_choice), parses into one tool call whose name is
allowed and whose arguments match the tool's parameters schema; speculation keeps greedy
output exact under it."""
from __future__ import annotations

import json

import jsonschema
import pytest

from tandem.sampling_params import SamplingParams
from tandem.serve.openai_protocol import ChatCompletionRequest
from tandem.serve.tool_calls import parse_tool_calls
from tandem.serve.tool_choice import tool_call_constraint

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 24}}, "required": ["city"],
    "additionalProperties": False}}}
REPEAT = {"type": "function", "function": {"name": "repeat_word", "parameters": {
    "type": "object", "properties": {"word": {"enum": ["yes", "no"]}, "times": {"type": "integer", "minimum": 1,
                                                                              "maximum": 9}},
    "required": ["word", "times"], "additionalProperties": False}}}
TOOLS = [WEATHER, REPEAT]
ASK = [{"role": "user", "content": "What is the weather like in Paris? Answer with a tool call."}]


@pytest.mark.parametrize("choice, allowed", [("required", {"get_weather", "repeat_word"}), ("repeat_word", {"repeat_word"})])
def test_a_required_or_named_call_parses_into_a_valid_tool_call(make_engine, choice, allowed):
    params = SamplingParams(max_tokens=64, structured=tool_call_constraint(TOOLS, choice))
    outs = {}
    for drafter in ("none", "ngram"):
        engine = make_engine(drafter)
        (outs[drafter],) = engine.generate([engine.chat_prompt(ASK)], params)
    out = outs["none"]
    assert out.finish_reason == "stop", out.text
    assert outs["ngram"].token_ids == out.token_ids
    content, calls = parse_tool_calls(out.text, frozenset(t["function"]["name"] for t in TOOLS))
    assert content is None and len(calls) == 1, out.text
    (call,) = calls
    assert call.name in allowed
    schema = next(t["function"]["parameters"] for t in TOOLS if t["function"]["name"] == call.name)
    jsonschema.validate(json.loads(call.arguments), schema)


def test_the_request_fields_give_the_constraint_and_refuse_a_second_one():
    body = {"model": "m", "messages": ASK, "tools": TOOLS}
    req = ChatCompletionRequest.model_validate({**body, "tool_choice": {"type": "function", "function": {"name": "get_weather"}}})
    assert req.sampling_params(16, 64).structured.kind == "grammar"
    assert ChatCompletionRequest.model_validate({**body, "tool_choice": "auto"}).sampling_params(16, 64).structured is None
    both = ChatCompletionRequest.model_validate({**body, "tool_choice": "required", "response_format": {"type": "json_object"}})
    from tandem.errors import InvalidRequestError

    with pytest.raises(InvalidRequestError, match="tool_choice"):
        both.sampling_params(16, 64)
