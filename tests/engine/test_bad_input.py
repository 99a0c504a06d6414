"""Bad input gets a clear error naming the field, and running requests are unaffected."""
from __future__ import annotations

import pytest

from tandem.config import EngineConfig
from tandem.errors import InvalidRequestError
from tandem.sampling_params import SamplingParams

from .prompts import PROMPTS


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": -3}, "max_tokens"),
        ({"temperature": -0.1}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -1}, "top_k"),
        ({"stop": ("",)}, "stop"),
    ],
)
def test_bad_sampling_params_name_the_field(kwargs, field):
    with pytest.raises(InvalidRequestError) as e:
        SamplingParams(**kwargs)
    assert e.value.field == field and field in str(e.value)


def test_unknown_drafter_names_the_field():
    with pytest.raises(InvalidRequestError) as e:
        EngineConfig(drafter="medusa")
    assert e.value.field == "drafter" and "medusa" in str(e.value)


def test_bad_requests_are_refused_while_a_good_one_runs_unharmed(make_engine):
    engine = make_engine("ngram")
    params = SamplingParams(max_tokens=16)
    reference = engine.generate([PROMPTS[1]], params)[0].token_ids

    good = engine.add_request(PROMPTS[1], params)
    engine.step()
    bad = [
        ("", "prompt"),
        ([], "prompt"),
        ([1, 2, 10**9], "prompt"),
        ("x " * 2000, "prompt"),  # longer than the context
    ]
    for prompt, field in bad:
        with pytest.raises(InvalidRequestError) as e:
            engine.add_request(prompt, params)
        assert e.value.field == field
    with pytest.raises(InvalidRequestError) as e:
        engine.add_request(PROMPTS[1], params, request_id=good)
    assert e.value.field == "request_id"

    final = None
    while final is None:
        for out in engine.step():
            if out.request_id == good and out.finished:
                final = out
    assert final.token_ids == reference
    assert not engine.has_unfinished()
