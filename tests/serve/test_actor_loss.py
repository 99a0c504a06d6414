"""A served app (two ingress replicas behind HAProxy) that loses one of its actors, on its
own Ray cluster in a process of its own (lose_actor.py, run once for the module), the
cases in turn, each once the app is whole again:
- its engine (the scheduler actor): Serve replaces the engine replica, the ingress
  replicas (still up) take the new engine, and meanwhile clients get 503 with
  Retry-After in an OpenAI error body, not a hang or a bare 500;
- one ingress replica mid-stream: its stream ends, the other replica's stream goes on to
  the text it would have had alone, the lost replica's request stops generating, and
  Serve brings the replica back."""
from __future__ import annotations

import os

import pytest
from .script_result import script_result

SCRIPT = os.path.join(os.path.dirname(__file__), "lose_actor.py")
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def lost() -> dict:
    """What clients saw in each case: {"engine": ..., "ingress": ...}."""
    return script_result([SCRIPT, "engine,ingress", "2"], timeout_s=900)


def test_a_lost_engine_is_replaced_and_clients_get_503_meanwhile(lost):
    result = lost["engine"]
    assert result["back_s"] < 240, result
    assert result["outage"], result  # the requests right after the kill found no engine
    # each an OpenAI error body from tandem's ingress (not HAProxy's or Serve's proxy's own
    # plain-text page): the ingress replicas stay up while the engine is replaced
    assert all(said[0] == 503 and said[1] and said[2] == "service_unavailable" for said in result["outage"]), result
    assert max(result["took_s"]) < 10, result  # each answered at once: none held until the engine was back
    assert result["status"] == "RUNNING", result
    # every ingress replica serves again, from the new engine, the same greedy text
    assert result["after"] == [[200, result["before"]]] * len(result["after"]), result


def test_a_lost_ingress_replica_ends_its_own_stream_only(lost):
    result = lost["ingress"]
    assert len(result["ports"]) == 2, result  # a stream straight from each replica
    lost, kept = sorted(result["streams"], key=lambda x: x["error"] is None)
    assert lost["error"] is not None and lost["ended_s"] < 10 and lost["text"] != result["alone"], result
    assert kept["error"] is None and kept["text"] == result["alone"], result
    assert result["running_after"] == 0, result  # the lost replica's request was aborted, not left running
    assert result["status"] == "RUNNING" and result["after"] == [200] * 4, result
