"""SamplingParams refuses what the shard protocol cannot carry (int32 fields), naming the field,
so one such request through the Python API cannot fail the engine batch it would join."""
from __future__ import annotations

import pytest

from tandem.errors import InvalidRequestError
from tandem.sampling_params import INT32_MAX, SamplingParams


@pytest.mark.parametrize("field, value", [("top_k", 2**200), ("top_k", INT32_MAX + 1), ("stop_token_ids", (INT32_MAX + 1,))])
def test_values_past_int32_are_refused_naming_the_field(field, value):
    with pytest.raises(InvalidRequestError) as e:
        SamplingParams(**{field: value})
    assert e.value.field == field


def test_the_largest_int32_values_are_accepted():
    p = SamplingParams(top_k=INT32_MAX, stop_token_ids=(INT32_MAX,))
    assert p.top_k == INT32_MAX and p.stop_token_ids == (INT32_MAX,)
