"""`tandem serve`: its own local Ray cluster and the app, the URL printed, a request
answered, and a clean stop on SIGTERM, on Ctrl-C (SIGINT), and on a SIGTERM to its whole
process group (`timeout`, a supervisor), which stops the cluster's processes too."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest

from tandem.serve.direct_http import free_port as _free_port


def _start(port: int) -> tuple[subprocess.Popen, list[str]]:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "tandem.cli", "serve", "--port", str(port), "--max-num-seqs", "4", "--api-key", "k"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True,
    )
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True).start()
    return proc, lines


@pytest.mark.slow
@pytest.mark.parametrize("sig,group,within_s", [(signal.SIGTERM, False, 90), (signal.SIGINT, False, 90), (signal.SIGTERM, True, 25)],
                         ids=["SIGTERM", "SIGINT", "SIGTERM-to-the-group"])
def test_tandem_serve_prints_the_url_serves_and_stops_cleanly(sig, group, within_s):
    port = _free_port()
    proc, lines = _start(port)
    try:
        url = f"http://127.0.0.1:{port}/v1"
        deadline = time.monotonic() + 300
        while not any(url in line for line in lines):
            assert proc.poll() is None, "".join(lines)[-4000:]
            assert time.monotonic() < deadline, "no URL printed within 300 s:\n" + "".join(lines)[-4000:]
            time.sleep(0.2)
        headers = {"Authorization": "Bearer k"}
        assert httpx.get(url + "/models", timeout=30).status_code == 401
        r = httpx.post(url + "/completions", headers=headers, timeout=120,
                       json={"model": "smollm2", "prompt": "Hello", "max_tokens": 3, "temperature": 0})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3

        if group:  # before: Serve waited 30 s for its controller, gone with the group (39-42 s in all)
            os.killpg(proc.pid, sig)
        else:
            proc.send_signal(sig)
        assert proc.wait(within_s) == 0, "".join(lines)[-4000:]
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"http://127.0.0.1:{port}/health", timeout=5)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
