"""Structured outputs with speculation on: constrained greedy output with drafts equals
constrained greedy output without them, token for token, and free requests in the same
batch are unchanged; outputs parse and validate; bad constraints are refused at intake."""
from __future__ import annotations

import json
import re

import jsonschema
import pytest

from tandem.errors import InvalidRequestError
from tandem.grammar.constraint import GrammarConstraint as G
from tandem.sampling_params import SamplingParams

from .prompts import prompts

PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age", "tags"],
          "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"},
                         "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 3}}}
CONSTRAINTS = [G.json_schema(PERSON), G("regex", r"[0-9]{1,3}(, [0-9]{1,3}){2,6}"), G.choice(["red", "green", "blue"]),
               G("json_object")]
MAX_TOKENS = 16  # long enough for drafts to be proposed, accepted and rejected under each grammar


def mixed(batch: int) -> tuple[list[str], list[SamplingParams]]:
    """Even requests constrained (the constraints in turn), odd ones free."""
    texts = prompts(batch)
    params = [SamplingParams(max_tokens=MAX_TOKENS, structured=CONSTRAINTS[(i // 2) % len(CONSTRAINTS)] if i % 2 == 0 else None)
              for i in range(batch)]
    return texts, params


@pytest.fixture(scope="module")
def reference(make_engine):
    """Without drafts: each request's greedy output, free or under its grammar."""
    texts, params = mixed(16)
    outs = make_engine("none").generate(texts, params)
    return {(t, p.structured): o.token_ids for t, p, o in zip(texts, params, outs)}


def check_equal(engine, batch, reference, label):
    texts, params = mixed(batch)
    outs = engine.generate(texts, params)
    for t, p, o in zip(texts, params, outs):
        assert o.finish_reason in ("stop", "length"), o.error
        assert o.token_ids == reference[(t, p.structured)], f"{label} b{batch} diverged on {t[:30]!r} ({p.structured})"
    return outs


@pytest.mark.parametrize("batch", [1, 4, 16])
def test_ngram_constrained_greedy_equals_no_speculation(batch, make_engine, reference):
    engine = make_engine("ngram", adaptive=False)
    outs = check_equal(engine, batch, reference, "ngram")
    assert sum(o.num_draft_tokens for o in outs) > 0


def cut_tokens(engine) -> float:
    return engine.metrics.grammar_cut_tokens._value.get()


@pytest.mark.parametrize("batch", [1, 4])  # b16 with a 135M drafter: ~40 s of CI for what the cut drafter's b16 covers
def test_draft_model_constrained_greedy_equals_no_speculation(batch, make_engine, self_draft_group, reference):
    # the target drafting for itself under the grammar's mask proposes the target's own masked picks
    engine = make_engine("draft-model", group=self_draft_group, draft_model="smollm2", adaptive=False)
    outs = check_equal(engine, batch, reference, "draft-model")
    assert sum(o.num_accepted_tokens for o in outs) > 0
    assert cut_tokens(engine) == 0, "a draft proposed under the mask was cut"


@pytest.mark.parametrize("batch", [1, 4, 16])
def test_a_weak_draft_model_under_grammars_keeps_greedy_output(batch, make_engine, weak_draft_group, truncated_draft_dir,
                                                               reference):
    # an 8-layer cut of the target: its masked drafts are often rejected, never refused by the grammar
    engine = make_engine("draft-model", group=weak_draft_group, draft_model=truncated_draft_dir, adaptive=False)
    outs = check_equal(engine, batch, reference, "weak draft-model")
    constrained = [o for o, p in zip(outs, mixed(batch)[1]) if p.structured is not None]
    assert sum(o.num_draft_tokens for o in constrained) > 0
    assert 0 < sum(o.num_accepted_tokens for o in outs) < sum(o.num_draft_tokens for o in outs)
    assert cut_tokens(engine) == 0, "a draft proposed under the mask was cut"


def test_masked_proposing_accepts_more_than_cut_proposing(make_engine, self_draft_group):
    """Digits, a colour, JSON: unmasked, the model's first draft is prose the grammar refuses
    (cut, with every draft after it); under the mask the target drafting for itself passes."""
    texts = ["The capital of France is"] * 3
    # 24 tokens: the masked runs' lead over the cut ones is a few tokens a request
    params = [SamplingParams(max_tokens=24, structured=c) for c in CONSTRAINTS[:3]]
    drafter = self_draft_group.shard.drafter
    runs = {}
    for name, matchers in (("cut", None), ("masked", drafter.matchers)):
        saved, drafter.matchers = drafter.matchers, matchers
        try:
            engine = make_engine("draft-model", group=self_draft_group, draft_model="smollm2", adaptive=False)
            runs[name] = (engine.generate(texts, params), cut_tokens(engine))
        finally:
            drafter.matchers = saved
    (cut, cut_count), (masked, masked_count) = runs["cut"], runs["masked"]
    assert [o.token_ids for o in cut] == [o.token_ids for o in masked]
    assert cut_count > 0 and masked_count == 0
    for a, b in zip(cut, masked):
        assert b.num_accepted_tokens > a.num_accepted_tokens, (a.text, a.num_accepted_tokens, b.num_accepted_tokens)


def test_seeded_sampling_under_a_grammar_with_a_draft_model_repeats(make_engine, weak_draft_group, truncated_draft_dir):
    engine = make_engine("draft-model", group=weak_draft_group, draft_model=truncated_draft_dir, adaptive=False)
    params = SamplingParams(max_tokens=32, temperature=0.9, seed=7, structured=G.json_schema(PERSON))
    prompt = engine.chat_prompt([{"role": "user", "content": "A person as JSON."}])
    a, b = engine.generate([prompt, prompt], [params, params])
    (alone,) = engine.generate([prompt], params)
    assert a.token_ids == b.token_ids == alone.token_ids
    assert a.num_draft_tokens > 0 and cut_tokens(engine) == 0
    if a.finish_reason == "stop":
        jsonschema.validate(json.loads(a.text), PERSON)


SCHEMAS = [
    {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
    {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]},
    {"type": "object", "properties": {"x": {"type": "number"}, "y": {"type": "number"}}, "required": ["x", "y"]},
    {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}}, "required": ["color"]},
    {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99}}, "required": ["n"]},
    {"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 4},
    {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 3},
    {"type": "object", "properties": {"name": {"type": "string", "maxLength": 10}, "nick": {"type": "string", "maxLength": 5}},
     "required": ["name"], "additionalProperties": False},
    {"type": "object", "properties": {"p": {"type": "object", "properties": {"q": {"type": "integer"}}, "required": ["q"]}},
     "required": ["p"]},
    {"type": "string", "maxLength": 16},
    {"type": "integer"},
    {"type": "boolean"},
    {"enum": ["yes", "no", "maybe"]},
    {"type": "object", "properties": {"items": {"type": "array", "maxItems": 2, "items": {
        "type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"], "additionalProperties": False}}},
     "required": ["items"], "additionalProperties": False},
    {"type": "object", "properties": {"v": {"type": ["integer", "null"]}}, "required": ["v"]},
    {"type": "object", "properties": {"s": {"type": "string", "pattern": "^[a-z]{2,5}$"}}, "required": ["s"]},
    {"type": "object", "properties": {"when": {"const": "now"}}, "required": ["when"]},
    {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "boolean"}, "c": {"enum": [1, 2, 3]}},
     "required": ["a", "b", "c"], "additionalProperties": False},
    {"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 4}]},
    {"type": "object", "properties": {"m": {"type": "array", "items": {"type": "number"}, "maxItems": 3}}, "required": ["m"],
     "additionalProperties": False},
    {"type": "number", "minimum": 1, "maximum": 5},
]


def test_json_schemas_regex_and_choice_outputs_parse_and_validate(make_engine):
    engine = make_engine("ngram")
    prompt = engine.chat_prompt([{"role": "user", "content": "Answer in JSON."}])
    regex, choices = r"[A-Z][a-z]{2,8} [0-9]{2}", ["alpha", "beta", "gamma"]
    # the values that end do so within 20 tokens; the rest ramble (in a string, in whitespace) to max_tokens
    params = [SamplingParams(max_tokens=24, structured=G.json_schema(s)) for s in SCHEMAS]
    params += [SamplingParams(max_tokens=16, structured=G("regex", regex)), SamplingParams(max_tokens=8, structured=G.choice(choices))]
    outs = engine.generate([prompt] * len(params), params)
    done = 0
    for s, o in zip(SCHEMAS, outs):
        assert o.finish_reason in ("stop", "length"), o.error
        if o.finish_reason == "stop":  # a complete value ended it
            jsonschema.validate(json.loads(o.text), s)
            done += 1
    # a small model may ramble inside a string or a number until max_tokens; most end
    assert done >= len(SCHEMAS) // 2, f"only {done} of {len(SCHEMAS)} schemas produced a complete value"
    assert re.fullmatch(regex, outs[-2].text) and outs[-2].finish_reason == "stop", outs[-2].text
    assert outs[-1].text in choices and outs[-1].finish_reason == "stop"


def test_seeded_sampling_under_a_grammar_repeats(make_engine):
    engine = make_engine("ngram")
    params = SamplingParams(max_tokens=32, temperature=0.9, seed=7, structured=G.json_schema(PERSON))
    prompt = engine.chat_prompt([{"role": "user", "content": "A person as JSON."}])
    a, b = engine.generate([prompt, prompt], [params, params])
    assert a.token_ids == b.token_ids
    if a.finish_reason == "stop":
        jsonschema.validate(json.loads(a.text), PERSON)


def test_max_tokens_cuts_a_constrained_output_with_length(make_engine):
    out = make_engine("none").generate(["Hi"], SamplingParams(max_tokens=3, structured=G.json_schema(PERSON)))[0]
    assert out.finish_reason == "length" and len(out.token_ids) == 3


@pytest.mark.parametrize("constraint, field", [
    (G("regex", "a("), "structured_outputs.regex"),
    (G.json_schema({"type": "foo"}), "structured_outputs.json"),
    (G("grammar", "start: undefined_rule"), "structured_outputs.grammar"),
])
def test_bad_constraint_is_refused_at_intake_naming_the_field(constraint, field, make_engine):
    engine = make_engine("none")
    with pytest.raises(InvalidRequestError) as e:
        engine.add_request("Hi", SamplingParams(max_tokens=4, structured=constraint))
    assert e.value.field == field
    assert not engine.has_unfinished()
    assert engine.generate(["Hi"], SamplingParams(max_tokens=2))[0].finish_reason == "length"
