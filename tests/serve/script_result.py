"""Run a test script in a process group of its own and read the JSON of its last
`RESULT ` line: the apps of such scripts own a Ray cluster of their own."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys


def script_result(argv: list[str], timeout_s: float, tail_chars: int = 4000) -> dict:
    proc = subprocess.Popen([sys.executable, *argv], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # whatever is left of it, whatever happened
        except ProcessLookupError:
            pass
        proc.wait()
    lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
    assert lines, out[-tail_chars:]
    return json.loads(lines[-1][len("RESULT "):])
