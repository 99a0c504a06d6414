"""`tandem serve` checks its HTTP port before starting a cluster: a listener there is an
error naming the port; the closed connections of a server that stopped (TIME_WAIT, which
refuse Serve's bind for a minute) are waited out, and a port that stays held is named."""
from __future__ import annotations

import socket

from tandem.serve.port_wait import FREE, LINGERING, LISTENING, port_state, wait_for_port


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _lingering_port() -> int:
    """A port a server stopped on after closing a connection first: TIME_WAIT is its side's
    (its listener without SO_REUSEADDR, as Serve's replica binds)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    conn, _ = listener.accept()
    conn.close()  # the server closes first, as a stream's end does
    assert client.recv(1) == b""
    client.close()
    listener.close()
    return port


def test_a_free_port_is_taken_at_once():
    port = _free_port()
    assert port_state("127.0.0.1", port) == (FREE, "")
    said = []
    assert wait_for_port("127.0.0.1", port, say=said.append) is None and said == []


def test_a_port_something_listens_on_is_named_without_waiting():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert port_state("127.0.0.1", port)[0] == LISTENING
        problem = wait_for_port("127.0.0.1", port, limit_s=60, say=lambda m: None)
        assert problem is not None and f"port {port}" in problem and "in use" in problem


def test_a_stopped_servers_closed_connections_are_waited_for_and_named_if_they_outlast_the_limit():
    port = _lingering_port()
    assert port_state("127.0.0.1", port) == (LINGERING, "")
    said = []
    problem = wait_for_port("127.0.0.1", port, limit_s=0.3, say=said.append, poll_s=0.05)
    assert len(said) == 1 and f"port {port}" in said[0] and "TIME_WAIT" in said[0]
    assert problem is not None and "still held" in problem


def test_tandem_serve_on_a_port_in_use_says_so_and_starts_nothing():
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        done = subprocess.run([sys.executable, "-m", "tandem.cli", "serve", "--port", str(port)],
                              capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr[-2000:]
    assert f"port {port} on 127.0.0.1 is in use" in done.stderr
    assert "Started a local Ray instance" not in done.stdout + done.stderr
