"""Penalties, logit_bias, min_tokens and min_p through the official openai client (real
Ray, real HTTP); a value out of range is a 400 naming its field."""
from __future__ import annotations

import openai
import pytest

PROMPT = "The three primary colors are"
FAVOURED = 314  # a plain word piece of the default model's vocabulary


def _stream_text(client, **kw) -> str:
    return "".join(c.choices[0].text for c in client.completions.create(stream=True, **kw) if c.choices)


def test_a_large_bias_makes_greedy_emit_that_token_only(openai_client, server):
    out = openai_client.completions.create(model=server.model, prompt=PROMPT, max_tokens=6, temperature=0,
                                           logit_bias={str(FAVOURED): 100})
    text = out.choices[0].text
    assert out.usage.completion_tokens == 6 and text
    piece = text[: len(text) // 6]
    assert text == piece * 6, text


def test_penalties_change_greedy_output_and_stream_the_same(openai_client, server):
    kw = dict(model=server.model, prompt=PROMPT, max_tokens=24, temperature=0)
    plain = openai_client.completions.create(**kw).choices[0].text
    ruled = dict(kw, presence_penalty=1.5, frequency_penalty=1.0, extra_body={"repetition_penalty": 1.3})
    full = openai_client.completions.create(**ruled).choices[0].text
    assert full != plain
    assert _stream_text(openai_client, **ruled) == full


def test_min_tokens_holds_the_end_off(openai_client, server):
    chat = [{"role": "user", "content": "Reply with the single word: yes"}]
    short = openai_client.chat.completions.create(model=server.model, messages=chat, max_tokens=40, temperature=0)
    assert short.choices[0].finish_reason == "stop"
    n = short.usage.completion_tokens
    held = openai_client.chat.completions.create(model=server.model, messages=chat, max_tokens=40, temperature=0,
                                                 extra_body={"min_tokens": n + 4, "min_p": 0.1})
    assert held.usage.completion_tokens >= n + 4


@pytest.mark.parametrize("field, value", [
    ("presence_penalty", 2.5), ("frequency_penalty", -3), ("repetition_penalty", 0), ("min_p", 1.5), ("min_tokens", -1),
    ("logit_bias", {"99999999": 1}), ("logit_bias", {"5": 101}), ("logit_bias", {"x": 1}),
])
def test_a_value_out_of_range_is_a_400_naming_its_field(openai_client, server, field, value):
    with pytest.raises(openai.BadRequestError) as e:
        openai_client.completions.create(model=server.model, prompt=PROMPT, max_tokens=4, extra_body={field: value})
    assert e.value.body["param"] == field, e.value.body
