"""Outputs over Ray as deltas: what the handle rebuilds equals what the engine made."""
from __future__ import annotations

import dataclasses

from tandem.actors.wire import Rebuilder, from_wire, merge, to_wire
from tandem.outputs import RequestOutput, Usage


def _outputs() -> list[RequestOutput]:
    """An engine's outputs for one request: whole text and ids so far, and the deltas."""
    pieces = [("Hel", [1, 2]), ("lo", [3]), ("", [4]), (" wo", [5, 6]), ("rld", [7])]
    outs, text, ids = [], "", []
    for i, (t, d) in enumerate(pieces):
        text, ids = text + t, ids + d
        last = i == len(pieces) - 1
        outs.append(RequestOutput("r", "Say hi", [9, 8], text, list(ids), t, d, last, "stop" if last else None, None,
                                  Usage(2, len(ids))))
    return outs


def test_rebuilt_outputs_equal_the_engines():
    outs = _outputs()
    wire = [from_wire(to_wire(o, i == 0)) for i, o in enumerate(outs)]
    assert all(w.text == "" and w.token_ids == [] for w in wire[:-1])  # nothing but deltas before the last
    assert all(w.prompt_token_ids == [] for w in wire[1:-1]) and wire[0].prompt_token_ids == [9, 8]
    assert wire[-1] == outs[-1]  # the last goes whole
    rebuild = Rebuilder()
    assert [rebuild(w) for w in wire] == outs


def test_merged_wire_outputs_rebuild_what_the_engine_made():
    outs = _outputs()
    wire = [from_wire(to_wire(o, i == 0)) for i, o in enumerate(outs)]
    # a consumer that fell behind takes the first three at once, then the rest
    merged = [merge(wire[:3]), merge(wire[3:])]
    assert merged[0].prompt_token_ids == [9, 8] and merged[0].delta_token_ids == [1, 2, 3, 4]
    assert merged[0].delta_text == "Hello" and not merged[0].finished
    assert merged[1] == dataclasses.replace(outs[-1], delta_text=" world", delta_token_ids=[5, 6, 7])
    rebuild = Rebuilder()
    assert [rebuild(w) for w in merged] == [dataclasses.replace(outs[2], delta_text="Hello", delta_token_ids=[1, 2, 3, 4]),
                                            merged[1]]


def test_a_wire_output_is_a_plain_tuple_and_comes_back_equal():
    outs = _outputs()
    assert type(to_wire(outs[1], False)) is tuple
    assert from_wire(to_wire(outs[-1], False)) == outs[-1]  # the last, whole
    assert from_wire(to_wire(outs[0], True)) == dataclasses.replace(outs[0], text="", token_ids=[])
