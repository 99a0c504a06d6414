"""The Qwen2.5 (Hermes) tool-call format read from a model's text, whole and streamed."""
from __future__ import annotations

import json

import pytest

from tandem.serve.tool_calls import ToolCallStream, parse_tool_calls

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "C"}}\n</tool_call>'
TWO = CALL + "\n" + '<tool_call>\n{"name": "get_time", "arguments": {"zone": "CET"}}\n</tool_call>'


NAMES = frozenset({"get_weather", "get_time"})
BARE = '{"name": "get_weather", "arguments": {"city": "Paris"}}'


def _streamed(text: str, cut: int) -> tuple[str, list]:
    """The text fed in pieces of `cut` characters: the content sent and the calls."""
    s, content, calls = ToolCallStream(NAMES), "", []
    pieces = [text[i:i + cut] for i in range(0, len(text), cut)] or [""]
    for i, piece in enumerate(pieces):
        c, new = s.feed(piece, i == len(pieces) - 1)
        content += c
        calls += new
    return content, calls


def test_a_call_is_parsed_into_name_and_json_arguments_with_no_content():
    content, calls = parse_tool_calls(CALL)
    assert content is None and len(calls) == 1
    assert calls[0].name == "get_weather" and json.loads(calls[0].arguments) == {"city": "Paris", "unit": "C"}
    part = calls[0].as_message_part()
    assert part["type"] == "function" and part["id"].startswith("call_")


def test_text_around_calls_is_content_and_two_calls_are_two():
    content, calls = parse_tool_calls("Let me check.\n" + TWO + "\nDone.")
    assert content == "Let me check.Done."
    assert [c.name for c in calls] == ["get_weather", "get_time"]


@pytest.mark.parametrize("text", [
    "<tool_call>\n{not json}\n</tool_call>",  # bad JSON
    '<tool_call>{"arguments": {}}</tool_call>',  # no name
    '<tool_call>{"name": "f", "arguments": {"a": 1}}',  # never closed
    "plain text, no call at all",
])
def test_what_is_no_call_stays_content_as_it_was(text):
    assert parse_tool_calls(text) == (text, [])


def test_a_bare_call_of_a_named_tool_is_a_call_and_other_json_is_content():
    content, calls = parse_tool_calls("\n" + BARE + "\n", NAMES)
    assert content is None and [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", {"city": "Paris"})]
    other = '{"name": "not_a_tool", "arguments": {}}'
    assert parse_tool_calls(other, NAMES) == (other, [])
    assert parse_tool_calls(BARE + " and more", NAMES) == (BARE + " and more", [])
    assert parse_tool_calls(BARE) == (BARE, [])  # no tools named: no bare call


@pytest.mark.parametrize("text", [CALL, "Let me check.\n" + TWO + "\nDone.", "a <tool_c", "x <tool_call>{bad}</tool_call> y",
                                  '<tool_call>{"name": "f", "arguments": {"a": 1}}', "no call", BARE, " " + BARE + "!",
                                  "{" + CALL, '{"x": 1}'])
@pytest.mark.parametrize("cut", [1, 3, 7, 1000])
def test_streamed_in_any_pieces_it_gives_the_same_content_and_calls(text, cut):
    whole_content, whole_calls = parse_tool_calls(text, NAMES)
    content, calls = _streamed(text, cut)
    assert content == (whole_content or "")
    assert [(c.name, c.arguments) for c in calls] == [(c.name, c.arguments) for c in whole_calls]


def test_a_stream_holds_back_a_tail_that_may_open_a_call_and_the_call_until_it_closes():
    s = ToolCallStream(NAMES)
    assert s.feed("Sure <tool", False) == ("Sure", [])
    assert s.feed('_call>{"name": "f", "arguments": {}}', False) == ("", [])
    content, calls = s.feed("</tool_call>", False)
    assert content == "" and [c.name for c in calls] == ["f"]
