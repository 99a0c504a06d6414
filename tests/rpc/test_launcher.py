"""ProcessLauncher: shard processes that die with their parent, and a start failure that
says why."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from polling import wait_for
from tandem.rpc.launcher import ProcessLauncher

ORPHANING_PARENT = """
import os, sys
from tandem.rpc.launcher import ProcessLauncher
launcher = ProcessLauncher(2, threads_per_rank=1)
launcher.start()
print(*launcher.pids(), flush=True)
os._exit(0)  # no stop(): the children must notice on their own
"""


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie is dead too
        return f.read().split(")")[-1].split()[0] != "Z"


@pytest.mark.timeout(120)
def test_shard_processes_exit_when_their_parent_dies():
    out = subprocess.run([sys.executable, "-c", ORPHANING_PARENT], capture_output=True, text=True, timeout=100)
    pids = [int(p) for p in out.stdout.split()]
    assert len(pids) == 2, out.stderr
    # each watches its parent every 0.5 s, then stops its server (up to 3 s)
    wait_for(lambda: not any(alive(p) for p in pids), 60, f"shard processes {pids} to exit after their parent",
             every_s=0.2)


@pytest.mark.timeout(120)
def test_a_rank_that_cannot_start_fails_the_start_with_its_log():
    launcher = ProcessLauncher(1, host="256.0.0.1", threads_per_rank=1)  # no such address to bind
    with pytest.raises(RuntimeError, match="exited with .* before listening") as info:
        launcher.start()
    assert "256.0.0.1" in str(info.value)
    assert launcher.procs == []
