"""A served app of several engine replicas, on its own Ray cluster in a process of its
own (replicas_app.py, run once for the module): two replicas, then autoscaling.

- two replicas give the single engine's greedy text; 32 concurrent requests are spread
  over both (by the engines' own request counters); requests sharing a long prefix land
  on one replica and hit its prefix cache;
- one replica's scheduler actor killed mid-stream: only the streams it held end, with an
  error; the other's finish with their fault-free text; new requests go to the replica
  that serves; Serve restores the count;
- autoscaling: sustained load takes it from 1 to 2 replicas and idle back to 1, while
  every stream completes with its fault-free text (the replica removed drains first)."""
from __future__ import annotations

import os

import pytest
from .script_result import script_result

SCRIPT = os.path.join(os.path.dirname(__file__), "replicas_app.py")
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def seen() -> dict:
    return script_result([SCRIPT], timeout_s=800, tail_chars=6000)


def test_two_replicas_give_the_single_engines_greedy_text(seen):
    assert seen["two"]["equal"] == [True] * 4, seen["two"]
    assert seen["two"]["outputs"] == ["socket", "socket"], seen["two"]  # each replica's fast same-node path


def test_concurrent_requests_are_spread_over_both_replicas(seen):
    spread = seen["two"]["spread"]  # requests each replica's own counter finished
    assert len(spread) == 2 and sum(spread.values()) == 32, spread
    assert min(spread.values()) >= 8, spread  # each a real share, not a straggler


def test_requests_sharing_a_long_prefix_land_on_one_replica_and_hit_its_cache(seen):
    requests, hits = seen["two"]["prefix_requests"], seen["two"]["prefix_hits"]
    holder = max(requests, key=requests.get)
    assert requests[holder] == 4 and sum(requests.values()) == 4, requests
    assert hits[holder] >= 3 * 256, hits  # the three after the first found the prefix there (tokens)


def test_a_lost_replica_ends_only_its_own_streams_and_the_count_is_restored(seen):
    kill = seen["two"]["kill"]
    held = kill["held"]
    assert min(held.values()) >= 1, held  # both replicas held streams when one was killed
    errors = [s for s in kill["streams"] if s["error"]]
    assert len(errors) == held[kill["victim"]], kill
    assert all("output stream ended" in s["error"] for s in errors), kill
    assert all(s["done"] and s["equal"] for s in kill["streams"] if not s["error"]), kill
    assert kill["during"] == [200, 200, 200], kill  # new requests went to the replica that serves
    assert kill["restored_s"] < 240 and kill["after"] == [True] * 4, kill


def test_autoscaling_goes_from_one_to_two_and_back_with_every_stream_whole(seen):
    auto = seen["auto"]
    assert auto["up_s"] < 400 and auto["down_s"] < 400, auto
    assert auto["runs"] >= 12 and auto["bad"] == [], auto
    assert auto["deployment"].get("RUNNING") == 1, auto
