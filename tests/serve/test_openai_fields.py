"""n choices, batched prompts, tools, /tokenize and /detokenize, and the fields SDKs send,
through the official openai client against the running app (real Ray, real HTTP)."""
from __future__ import annotations

import httpx
import openai
import pytest

PROMPT = "Once upon a time"
CHAT = [{"role": "user", "content": "Tell me a story."}]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city.",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]


def _texts(resp) -> list[str]:
    assert [c.index for c in resp.choices] == list(range(len(resp.choices)))
    return [c.text if hasattr(c, "text") else c.message.content for c in resp.choices]


def test_n_seeded_choices_repeat_exactly_differ_from_each_other_and_count_in_usage(openai_client, server):
    kw = dict(model=server.model, prompt=PROMPT, max_tokens=12, temperature=1.0, seed=1234, n=4)
    first, again = openai_client.completions.create(**kw), openai_client.completions.create(**kw)
    assert _texts(first) == _texts(again)
    assert len(set(_texts(first))) == 4, _texts(first)
    # choice j is the request's seed + j: each alone with that seed is the same text
    alone = [openai_client.completions.create(**{**kw, "n": 1, "seed": 1234 + j}) for j in range(4)]
    assert [a.choices[0].text for a in alone] == _texts(first)
    assert first.usage.completion_tokens == sum(a.usage.completion_tokens for a in alone)
    assert first.usage.prompt_tokens == alone[0].usage.prompt_tokens  # the prompt counts once


def test_n_streamed_chunks_carry_their_index_and_equal_the_whole_response(openai_client, server):
    kw = dict(model=server.model, messages=CHAT, max_tokens=10, temperature=1.0, seed=7, n=3)
    whole = openai_client.chat.completions.create(**kw)
    texts, reasons, usage = {}, {}, None
    for chunk in openai_client.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True}):
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + (c.delta.content or "")
            if c.finish_reason is not None:
                reasons[c.index] = c.finish_reason
        usage = chunk.usage or usage
    assert [texts[k] for k in range(3)] == _texts(whole)
    assert [reasons[k] for k in range(3)] == [c.finish_reason for c in whole.choices]
    assert usage.completion_tokens == whole.usage.completion_tokens
    assert usage.prompt_tokens == whole.usage.prompt_tokens


def test_batched_prompts_get_a_choice_each_in_order_equal_to_each_alone(openai_client, server):
    prompts = ["The capital of France is", "One, two, three,"]
    alone = [openai_client.completions.create(model=server.model, prompt=p, max_tokens=8, temperature=0).choices[0].text
             for p in prompts]
    batched = openai_client.completions.create(model=server.model, prompt=prompts, max_tokens=8, temperature=0)
    assert _texts(batched) == alone
    ids = openai_client.completions.create(model=server.model, prompt=[[504, 3458, 282], [1116, 28]], max_tokens=4,
                                           temperature=0, n=2)
    texts = _texts(ids)
    assert len(texts) == 4 and texts[0] == texts[1] and texts[2] == texts[3]  # greedy: a prompt's n choices agree
    streamed = {}
    for chunk in openai_client.completions.create(model=server.model, prompt=prompts, max_tokens=8, temperature=0,
                                                  stream=True):
        for c in chunk.choices:
            streamed[c.index] = streamed.get(c.index, "") + c.text
    assert [streamed[0], streamed[1]] == alone


def test_tools_on_a_template_without_them_and_bad_tool_choices_are_400s_naming_the_field(openai_client, server):
    for choice in (None, "required", {"type": "function", "function": {"name": "get_weather"}}):
        extra = {} if choice is None else {"tool_choice": choice}
        with pytest.raises(openai.BadRequestError) as e:
            openai_client.chat.completions.create(model=server.model, messages=CHAT, tools=TOOLS, max_tokens=4, **extra)
        assert e.value.body["param"] == "tools" and "template" in e.value.body["message"]
    for extra in ({"tool_choice": {"type": "function", "function": {"name": "no_such_tool"}}},
                  {"tool_choice": "required", "response_format": {"type": "json_object"}}):
        with pytest.raises(openai.BadRequestError) as e:
            openai_client.chat.completions.create(model=server.model, messages=CHAT, tools=TOOLS, max_tokens=4, **extra)
        assert e.value.body["param"] == "tool_choice"
    # "none" renders no tools: the plain chat answer
    plain = openai_client.chat.completions.create(model=server.model, messages=CHAT, max_tokens=6, temperature=0)
    none = openai_client.chat.completions.create(model=server.model, messages=CHAT, tools=TOOLS, tool_choice="none",
                                                 max_tokens=6, temperature=0)
    assert none.choices[0].message.content == plain.choices[0].message.content


def test_fields_sdks_send_are_accepted_and_unknown_ones_are_400s_naming_them(openai_client, server):
    resp = openai_client.chat.completions.create(
        model=server.model, messages=CHAT, max_tokens=3, temperature=0, user="u1", metadata={"k": "v"}, store=False,
        service_tier="auto", parallel_tool_calls=False, extra_body={"prompt_cache_key": "k", "safety_identifier": "s"})
    assert resp.choices[0].message.content
    for field, value in (("functions", [{"name": "f"}]), ("frobnicate", 1), ("reasoning_effort", "low")):
        with pytest.raises(openai.BadRequestError) as e:
            openai_client.chat.completions.create(model=server.model, messages=CHAT, max_tokens=3,
                                                  extra_body={field: value})
        assert e.value.body["param"] == field


def test_tokenize_and_detokenize_round_trip_and_count_what_generation_counts(openai_client, server):
    r = httpx.post(server.base_url + "/tokenize", json={"model": server.model, "prompt": PROMPT}, timeout=60).json()
    assert r["count"] == len(r["tokens"]) > 0 and r["max_model_len"] == 4608
    done = openai_client.completions.create(model=server.model, prompt=PROMPT, max_tokens=1, temperature=0)
    assert done.usage.prompt_tokens == r["count"]
    back = httpx.post(server.base_url + "/detokenize", json={"tokens": r["tokens"]}, timeout=60).json()
    assert back == {"prompt": PROMPT}
    chat = httpx.post(server.base_url + "/tokenize", json={"messages": CHAT}, timeout=60).json()
    answered = openai_client.chat.completions.create(model=server.model, messages=CHAT, max_tokens=1)
    assert chat["count"] == answered.usage.prompt_tokens
    bad = httpx.post(server.base_url + "/detokenize", json={"tokens": [10 ** 9]}, timeout=60)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens"
    wrong = httpx.post(server.base_url + "/tokenize", json={"model": "gpt-9", "prompt": "x"}, timeout=60)
    assert wrong.status_code == 404
