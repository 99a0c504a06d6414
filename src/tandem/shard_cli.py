"""`tandem shard`: one shard server process (one rank), for runs without Ray.

    tandem shard --bind 127.0.0.1:0 --port-file rank0.addr

The server waits for Init (which carries the model, the rank and the collective
address). Its address goes to stdout ("listening on HOST:PORT") and, atomically, to
--port-file. With --parent-pid the process exits when that parent is gone, so a
launcher that dies never leaves shard processes behind.
"""
from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading

log = logging.getLogger("tandem.shard")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bind", default="127.0.0.1:0", help="HOST:PORT to listen on (port 0 = any free port). Default: %(default)s.")
    parser.add_argument("--port-file", help="Write the bound HOST:PORT to this file once the server listens.")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads for this rank (0 = torch's default).")
    parser.add_argument("--parent-pid", type=int, default=0, help="Exit when the process with this pid is no longer our parent.")
    parser.add_argument("--fault-injection", action="store_true", help="Accept the InjectFault RPC (tests only).")


def run(args: argparse.Namespace) -> int:
    import torch

    from tandem.rpc.server import start_shard_server
    from tandem.shard.factory import build_rank

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    server, address = start_shard_server(build_rank, args.bind, fault_injection=args.fault_injection)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    if args.parent_pid:
        threading.Thread(target=_watch_parent, args=(args.parent_pid, stop), daemon=True, name="parent-watch").start()
    if args.port_file:
        _write_atomically(args.port_file, address)
    print(f"tandem shard listening on {address}", flush=True)
    # Timed waits: a signal may land on any thread (CUDA and gRPC start many), and its
    # handler runs only once the main thread is back in Python.
    while not stop.wait(0.5):
        pass
    server.stop(grace=1.0).wait(2.0)
    # A forward may still hang in a pool thread (or in a collective): do not wait for it.
    sys.stdout.flush()
    os._exit(0)


def _watch_parent(parent_pid: int, stop: threading.Event) -> None:
    while not stop.wait(0.5):
        if os.getppid() != parent_pid:
            log.warning("parent %d is gone; exiting", parent_pid)
            stop.set()


def _write_atomically(path: str, text: str) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tandem shard", description=__doc__.splitlines()[0])
    parser.add_argument("--log-level", default="WARNING")
    add_arguments(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
