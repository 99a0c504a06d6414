"""Before `tandem serve` starts a local cluster: is its HTTP port free to bind as Serve's
direct-ingress replica binds it?

The replica binds without SO_REUSEADDR (Ray 2.60), so for a minute after a server on the
same port stopped, the kernel's TIME_WAIT entries of the connections that server closed
refuse the bind (SO_REUSEADDR would not pass them either: the old listener had none), and
Serve fails the deployment with "No available ports ... for RequestProtocol.HTTP protocol"
(a supervisor restarting tandem at once met it). So: a port something listens on, or one
this process may not bind, is an error named at once; a port held with nothing listening
is waited out (TIME_WAIT ends by itself, after 60 s on Linux).
"""
from __future__ import annotations

import errno
import socket
import time
from collections.abc import Callable

FREE, LINGERING, LISTENING = "free", "lingering", "listening"


def _bind_error(host: str, port: int) -> OSError | None:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError as e:
            return e
    return None


def _listened_on(host: str, port: int) -> bool:
    target = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)
    try:
        with socket.create_connection((target, port), timeout=1.0):
            return True
    except OSError:
        return False


def port_state(host: str, port: int) -> tuple[str, str]:
    """(FREE, ""), (LINGERING, "") where the port is held but nothing listens on it (a
    stopped server's TIME_WAIT entries), or (LISTENING, why) where a server listens on it
    or the bind fails otherwise (no right to the port, an address not this machine's)."""
    e = _bind_error(host, port)
    if e is None:
        return FREE, ""
    if e.errno != errno.EADDRINUSE:
        return LISTENING, f"cannot bind {host}:{port}: {e.strerror}"
    if _listened_on(host, port):
        return LISTENING, f"port {port} on {host} is in use by another process: stop it or pass --port"
    return LINGERING, ""


def wait_for_port(host: str, port: int, limit_s: float = 120.0, say: Callable[[str], None] = print,
                  poll_s: float = 0.25) -> str | None:
    """None once host:port is free; else why it is not (a listener, or connections that
    outlived limit_s)."""
    deadline = time.monotonic() + limit_s
    state, why = port_state(host, port)
    if state == LINGERING:
        say(f"tandem: port {port} is still held by the closed connections of a server that stopped "
            f"(TIME_WAIT); waiting up to {limit_s:.0f} s for the kernel to release it")
    while state == LINGERING and time.monotonic() < deadline:
        time.sleep(poll_s)
        state, why = port_state(host, port)
    if state == FREE:
        return None
    return why or f"port {port} on {host} was still held by closed connections after {limit_s:.0f} s"
