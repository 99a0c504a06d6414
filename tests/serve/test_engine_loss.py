"""A served app whose engine (the scheduler actor) dies: Serve replaces the engine replica,
the ingress replicas take the new engine, and meanwhile clients get 503 with Retry-After,
not a hang or a bare 500. Its own Ray cluster, in a process of its own (lose_engine.py)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

SCRIPT = os.path.join(os.path.dirname(__file__), "lose_engine.py")


@pytest.mark.slow
@pytest.mark.parametrize("replicas", [2])
def test_a_lost_engine_is_replaced_and_clients_get_503_meanwhile(replicas):
    proc = subprocess.Popen([sys.executable, SCRIPT, str(replicas)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=600)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # whatever is left of it, whatever happened
        except ProcessLookupError:
            pass
        proc.wait()
    lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
    assert lines, out[-4000:]
    result = json.loads(lines[-1][len("RESULT "):])
    assert result["back_s"] < 240, result
    assert result["outage"], result  # the requests right after the kill found no engine
    assert all(status == 503 and retry and kind == "service_unavailable" for status, retry, kind in result["outage"]), result
    assert result["status"] == "RUNNING", result
    # every ingress replica serves again, from the new engine, the same greedy text
    assert result["after"] == [[200, result["before"]]] * len(result["after"]), result
