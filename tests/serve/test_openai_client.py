"""The official openai client against the running app (real Ray, real HTTP)."""
from __future__ import annotations

import httpx
import pytest

PROMPT = "The three primary colors are"
CHAT = [{"role": "user", "content": "Name three fruits."}]


def _stream_completion(client, model, **kw):
    text, reasons, usage = "", [], None
    for chunk in client.completions.create(model=model, stream=True, stream_options={"include_usage": True}, **kw):
        if chunk.choices:
            text += chunk.choices[0].text
            reasons.append(chunk.choices[0].finish_reason)
        if chunk.usage is not None:
            usage = chunk.usage
    return text, reasons, usage


def test_greedy_completion_streamed_equals_non_streamed_with_usage(openai_client, server):
    full = openai_client.completions.create(model=server.model, prompt=PROMPT, max_tokens=24, temperature=0)
    choice = full.choices[0]
    assert choice.text and choice.finish_reason in ("stop", "length")
    assert full.usage.completion_tokens > 0 and full.usage.prompt_tokens > 0
    assert full.usage.total_tokens == full.usage.prompt_tokens + full.usage.completion_tokens

    text, reasons, usage = _stream_completion(openai_client, server.model, prompt=PROMPT, max_tokens=24, temperature=0)
    assert text == choice.text
    assert reasons[-1] == choice.finish_reason and all(r is None for r in reasons[:-1])
    assert usage.completion_tokens == full.usage.completion_tokens


def test_greedy_chat_uses_the_template_and_streams_the_same_text(openai_client, server):
    full = openai_client.chat.completions.create(model=server.model, messages=CHAT, max_tokens=24, temperature=0)
    msg = full.choices[0].message
    assert msg.role == "assistant" and msg.content
    # the chat template wraps the message: far more prompt tokens than the words
    assert full.usage.prompt_tokens > 10

    text, roles = "", []
    for chunk in openai_client.chat.completions.create(model=server.model, messages=CHAT, max_tokens=24, temperature=0, stream=True):
        delta = chunk.choices[0].delta
        roles.append(delta.role)
        text += delta.content or ""
    assert text == msg.content
    assert roles[0] == "assistant"


def test_a_stop_string_ends_the_text_before_it(openai_client, server):
    full = openai_client.completions.create(model=server.model, prompt=PROMPT, max_tokens=24, temperature=0).choices[0].text
    word = full.split()[1]
    cut = openai_client.completions.create(model=server.model, prompt=PROMPT, max_tokens=24, temperature=0, stop=[word])
    assert cut.choices[0].finish_reason == "stop"
    assert cut.choices[0].text == full[: full.index(word)]
    streamed, reasons, _ = _stream_completion(openai_client, server.model, prompt=PROMPT, max_tokens=24, temperature=0, stop=[word])
    assert streamed == cut.choices[0].text and reasons[-1] == "stop"


def test_max_tokens_bounds_the_completion(openai_client, server):
    r = openai_client.completions.create(model=server.model, prompt="Count: 1, 2, 3,", max_tokens=5, temperature=0)
    assert r.usage.completion_tokens == 5 and r.choices[0].finish_reason == "length"


def test_seeded_sampling_repeats_itself(openai_client, server):
    kw = dict(model=server.model, prompt="Once upon a time", max_tokens=12, temperature=0.9, top_p=0.95, seed=1234)
    a = openai_client.completions.create(**kw).choices[0].text
    b = openai_client.completions.create(**kw).choices[0].text
    assert a == b


def test_models_health_and_metrics(openai_client, server):
    assert [m.id for m in openai_client.models.list().data] == [server.model]
    health = httpx.get(server.base_url + "/health").json()
    assert health["status"] == "ok"
    metrics = httpx.get(server.base_url + "/metrics")
    assert metrics.status_code == 200
    for name in ("tandem:spec_decode_num_drafts", "tandem:spec_decode_num_accepted_tokens", "tandem:generation_tokens",
                 "tandem:num_requests_running"):
        assert name in metrics.text


def test_the_python_handle_reaches_the_served_engine(server, openai_client):
    """The served engine is a named actor: any Ray program can connect to it."""
    from tandem.actors import connect

    from .conftest import APP_ENGINE_NAME

    handle = connect(APP_ENGINE_NAME)
    via_http = openai_client.completions.create(model=server.model, prompt=PROMPT, max_tokens=12, temperature=0).choices[0].text
    assert handle.generate(PROMPT, max_tokens=12, temperature=0.0).text == via_http


@pytest.mark.parametrize("stream", [False, True])
def test_an_unknown_model_is_an_openai_not_found_error(openai_client, stream):
    import openai

    with pytest.raises(openai.NotFoundError) as e:
        openai_client.completions.create(model="no-such-model", prompt="hi", max_tokens=4, stream=stream)
    assert e.value.body["code"] == "model_not_found"
