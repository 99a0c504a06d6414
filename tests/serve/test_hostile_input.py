"""Hostile or unlucky input against the served app (real Ray Serve, the default model):
each is a 4xx with an OpenAI error body naming what is wrong, and the server serves a
normal request right after."""
from __future__ import annotations

import json

import httpx
import pytest

JSON = {"content-type": "application/json"}


def post(server, path: str, content: bytes, headers=JSON) -> httpx.Response:
    return httpx.post(f"{server.v1}/{path}", content=content, headers=headers, timeout=120)


def assert_error(r: httpx.Response, status: int, param=None, code=None, says: str = "") -> dict:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json")
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"], err
    assert err["param"] == param and (code is None or err["code"] == code), err
    assert says in err["message"], err
    return err


def assert_serves(server) -> None:
    ok = httpx.post(f"{server.v1}/completions", json={"model": server.model, "prompt": "Hi", "max_tokens": 2,
                                                      "temperature": 0}, timeout=120)
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 2, ok.text


def body(**fields) -> bytes:
    return json.dumps({"model": "smollm2", "max_tokens": 2, **fields}).encode()


def test_a_lone_surrogate_in_a_prompt_is_a_400_naming_prompt(server):
    r = post(server, "completions", b'{"model": "smollm2", "prompt": "\\ud800 hi", "max_tokens": 2}')
    assert_error(r, 400, "prompt", "invalid_text", "surrogate")
    assert_serves(server)


def test_a_lone_surrogate_in_a_message_is_a_400_naming_the_message_content(server):
    r = post(server, "chat/completions",
             b'{"model": "smollm2", "messages": [{"role": "user", "content": "hi \\udfff"}], "max_tokens": 2}')
    assert_error(r, 400, "messages[0].content", "invalid_text")
    assert_serves(server)


def test_a_surrogate_pair_is_text_and_is_served(server):
    r = post(server, "completions", b'{"model": "smollm2", "prompt": "\\ud83d\\ude00 hi", "max_tokens": 2}')
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("nested", [b"[" * 5000 + b"]" * 5000,
                                    b'{"model": "smollm2", "prompt": ' + b"[" * 5000 + b"]" * 5000 + b"}"])
def test_a_body_nested_5000_deep_is_a_400_not_a_recursion_error(server, nested):
    assert_error(post(server, "completions", nested), 400, None, "invalid_json", "nested too deeply")
    assert_serves(server)


def test_a_20_mb_body_is_a_413_naming_the_limit(server):
    r = post(server, "completions", body(prompt="a" * 20_000_000))
    err = assert_error(r, 413, None, "body_too_large", str(8 << 20))
    assert "limit" in err["message"]
    assert_serves(server)


def test_a_20_mb_body_sent_with_expect_100_continue_is_refused_before_it_is_sent(server):
    import subprocess

    # curl waits for 100 Continue before a large body: the 413 comes instead
    big = body(prompt="a" * 20_000_000)
    out = subprocess.run(["curl", "-sS", "-H", "content-type: application/json", "-H", "Expect: 100-continue",
                          "--data-binary", "@-", "-w", "\n%{http_code} %{size_upload}", f"{server.v1}/completions"],
                         input=big, capture_output=True, timeout=60, check=True).stdout.decode()
    text, status_line = out.rsplit("\n", 1)
    status, uploaded = status_line.split()
    assert status == "413" and json.loads(text)["error"]["code"] == "body_too_large"
    assert float(uploaded) < len(big) / 2, f"curl sent {uploaded} of {len(big)} bytes"


@pytest.mark.parametrize("literal", [b"NaN", b"Infinity", b"-Infinity", b"1e999"])
def test_non_finite_numbers_are_a_400(server, literal):
    r = post(server, "completions", b'{"model": "smollm2", "prompt": "hi", "temperature": ' + literal + b"}")
    assert_error(r, 400, None, "invalid_json")


def test_an_integer_of_5000_digits_is_a_400(server):
    r = post(server, "completions", b'{"model": "smollm2", "prompt": "hi", "seed": ' + b"9" * 5000 + b"}")
    assert_error(r, 400, None, "invalid_json")


@pytest.mark.parametrize("field, value", [("seed", 2**64), ("top_k", 2**200), ("stop_token_ids", [2**40]),
                                          ("max_tokens", 2**40), ("temperature", -1.0)])
def test_absurd_numbers_are_a_400_naming_the_field(server, field, value):
    assert_error(post(server, "completions", body(prompt="hi", **{field: value})), 400, field)
    assert_serves(server)


@pytest.mark.parametrize("ctype", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"])
def test_a_body_that_is_not_json_by_its_content_type_is_a_415(server, ctype):
    r = post(server, "completions", body(prompt="hi"), headers={"content-type": ctype})
    assert_error(r, 415, None, "unsupported_media_type", "application/json")


def test_json_with_a_charset_is_json(server):
    r = post(server, "completions", body(prompt="hi"), headers={"content-type": "application/json; charset=utf-8"})
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("stop, says", [(["a", "b", "c", "d", "e"], "at most 4"), ("x" * 257, "256 characters"),
                                        (["x" * 1_000_000], "256 characters")])
def test_oversized_stop_lists_and_strings_are_a_400(server, stop, says):
    assert_error(post(server, "completions", body(prompt="hi", stop=stop)), 400, "stop", None, says)


def test_a_prompt_over_the_context_is_a_400(server):
    assert_error(post(server, "completions", body(prompt="hello " * 5000)), 400, "prompt", None, "max_model_len")
    assert_error(post(server, "completions", body(prompt=[1] * 4700)), 400, "prompt", None, "max_model_len")


def test_a_prompt_text_over_the_character_limit_never_reaches_the_tokenizer(server):
    import time

    started = time.monotonic()
    r = post(server, "chat/completions", body(messages=[{"role": "user", "content": "hello " * 1_000_000}]))
    assert_error(r, 400, "messages", "prompt_too_long", "characters")
    assert time.monotonic() - started < 5  # tokenizing it would take seconds (the step thread's)


@pytest.mark.parametrize("raw", [b"[1, 2]", b'"a prompt"', b"null", b"42"])
def test_a_body_that_is_not_an_object_is_a_400(server, raw):
    assert_error(post(server, "completions", raw), 400, None, "invalid_json", "JSON object")


def test_a_surrogate_refused_by_the_engine_harms_no_other_request_of_its_batch(server):
    from tandem.actors import connect
    from tandem.errors import InvalidRequestError

    from .conftest import APP_ENGINE_NAME

    # straight to the engine, past the HTTP check: the one tokenizer call of a batch
    # must not fail for the good prompts in it
    handle = connect(APP_ENGINE_NAME)
    with pytest.raises(InvalidRequestError) as e:
        handle.generate("\ud800 hi", max_tokens=2)
    assert e.value.field == "prompt"
    assert handle.generate("Hi", max_tokens=2, temperature=0).usage.completion_tokens == 2
