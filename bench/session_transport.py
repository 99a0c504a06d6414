"""What one message each way costs on the session socket, blocking or busy-polling.

    python bench/session_transport.py [--work-ms 2.0] [--client-ms 0.3] [--messages 2000] [--bytes 1000]

Two processes, as a scheduler and its rank: the client sends a frame and waits for the
reply; the server works --work-ms (a busy loop holding the GIL, as a forward that waits
on its GPU does) before it answers; the client then works --client-ms before the next
command (the scheduler's own part of a tick). The frames go through the product's own
FrameReader and write_frame. Reported per mode: the median and p90 of the round trip
less the server's work, in ms. Modes: who busy-polls its next message (session_spin_us)
before it blocks. Prints a table, then one JSON line {"round_trip_ms": {mode: {...}}}.
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import secrets
import socket
import statistics
import struct
import sys
import time

from common import json_line, machine, print_table

from tandem.rpc.session_socket import FrameReader, write_frame

SPIN_S = 0.02  # the product's default where there are cores to spare
MODES = {"blocking": (0.0, 0.0), "client polls": (SPIN_S, 0.0), "server polls": (0.0, SPIN_S),
         "both poll": (SPIN_S, SPIN_S)}
_WORKED = struct.Struct("<d")


def busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def server(name: str, spin_s: float, work_s: float) -> None:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind("\0" + name)
    listener.listen(1)
    conn, _ = listener.accept()
    reader = FrameReader(conn, spin_s)
    try:
        while True:
            frame = reader.read()
            started = time.perf_counter()
            busy(work_s)
            write_frame(conn, _WORKED.pack(time.perf_counter() - started) + frame[_WORKED.size:])
    except EOFError:
        pass


def client(name: str, spin_s: float, client_s: float, messages: int, size: int) -> list[float]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    for _ in range(200):  # the server process is starting
        try:
            sock.connect("\0" + name)
            break
        except (ConnectionRefusedError, FileNotFoundError):
            time.sleep(0.01)
    reader, payload, overheads = FrameReader(sock, spin_s), b"\0" * size, []
    for _ in range(messages):
        sent = time.perf_counter()
        write_frame(sock, payload)
        reply = reader.read()
        overheads.append(time.perf_counter() - sent - _WORKED.unpack_from(reply)[0])
        busy(client_s)
    sock.close()
    return overheads[messages // 10:]  # the first tenth warms up


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work-ms", type=float, default=2.0, help="the server's work per message (the forward)")
    ap.add_argument("--client-ms", type=float, default=0.3, help="the client's work between messages")
    ap.add_argument("--messages", type=int, default=2000)
    ap.add_argument("--bytes", type=int, default=1000, help="size of each frame")
    args = ap.parse_args(argv)
    ctx = mp.get_context("spawn")
    rows, out = [], {}
    for mode, (client_spin, server_spin) in MODES.items():
        name = f"tandem-probe-{os.getpid()}-{secrets.token_hex(4)}"
        proc = ctx.Process(target=server, args=(name, server_spin, args.work_ms / 1000), daemon=True)
        proc.start()
        try:
            got = client(name, client_spin, args.client_ms / 1000, args.messages, max(args.bytes, _WORKED.size))
        finally:
            proc.join(timeout=10)
            proc.kill()
        ms = sorted(1000 * x for x in got)
        out[mode] = {"p50": statistics.median(ms), "p90": ms[int(0.9 * (len(ms) - 1))]}
        rows.append([mode, out[mode]["p50"], out[mode]["p90"]])
    print_table(["mode", "round trip p50 (ms)", "p90 (ms)"], rows,
                title=f"a {args.bytes}-byte frame each way, server works {args.work_ms} ms, client {args.client_ms} ms")
    json_line({"round_trip_ms": out, "work_ms": args.work_ms, "client_ms": args.client_ms, "machine": machine()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
