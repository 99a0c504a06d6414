"""Structured outputs over real HTTP: the openai client's parse with a pydantic model, vLLM's
structured_outputs on completions, and bad constraints answered 400 naming the field."""
from __future__ import annotations

import re

import httpx
from pydantic import BaseModel, Field


class City(BaseModel):
    name: str = Field(max_length=12)
    population: int


def test_the_openai_clients_parse_round_trips_a_pydantic_model(openai_client, server):
    chat = [{"role": "user", "content": "Give one city as JSON."}]
    r = openai_client.beta.chat.completions.parse(model=server.model, messages=chat, response_format=City, max_tokens=40, temperature=0)
    choice = r.choices[0]
    assert choice.finish_reason == "stop", choice
    assert isinstance(choice.message.parsed, City)
    assert City.model_validate_json(choice.message.content) == choice.message.parsed


def test_completions_take_vllm_structured_outputs(server):
    body = {"model": server.model, "prompt": "Pick a colour:", "max_tokens": 8, "temperature": 0}
    r = httpx.post(server.v1 + "/completions", json={**body, "structured_outputs": {"choice": ["red", "blue"]}}, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] in ("red", "blue")
    r = httpx.post(server.v1 + "/completions", json={**body, "structured_outputs": {"regex": "[0-9]{3}"}}, timeout=60)
    assert r.status_code == 200 and re.fullmatch("[0-9]{3}", r.json()["choices"][0]["text"]), r.text


def test_bad_schemas_and_regexes_are_400_naming_the_field_and_the_server_keeps_serving(server):
    body = {"model": server.model, "prompt": "Hi", "max_tokens": 4}
    bad = [({"structured_outputs": {"regex": "a("}}, "structured_outputs.regex"),
           ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "foo"}}}},
            "response_format.json_schema.schema")]
    for extra, field in bad:
        r = httpx.post(server.v1 + "/completions", json={**body, **extra}, timeout=60)
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == field, r.text
    ok = httpx.post(server.v1 + "/completions", json=body, timeout=60)
    assert ok.status_code == 200 and ok.json()["choices"][0]["finish_reason"] in ("stop", "length")
