"""Where a verify to a shard process spends its time: the two legs of the round trip and
the shard's own work, against the same verify in process; the Session stream over gRPC,
over the rank's session socket (blocking reads), and over it with both sides busy-polling
(`polling`, 20 ms: session_spin_us).

    python bench/verify_legs.py [--model smollm2 | tiny-random | a folder or GGUF]
                                [--concurrency 1 16] [--runs 3] [--pin 2,3[/4,5]]
                                [--carriers grpc socket polling]

serve_load's greedy requests (32 tokens each, C at once) run on the embedded engine and
on the engine over one shard process per carrier (no Ray), taking turns. A shard process
is this script in its worker mode: the usual shard server, whose Session replies are
stamped (when the command came out of the stream, when its reply was ready). All
processes read the same monotonic clock, so each verify of the scheduler splits into

    up     the scheduler sends the command -> the shard's handler has it
    shard  the handler has it -> the reply is ready (the riders, i.e. the last verdict,
           included: in process that commit is not part of the verify's time)
    down   the reply is ready -> the scheduler has it

--pin puts the scheduler's threads on the first set of cores and the shard's on the
second (or the same set): how much of the legs is threads waking on idle cores.
Prints a table, then one JSON line: {"legs_ms": {"c1": {"verify_local": ..., "tokens_per_s_local": ...,
"grpc": {"up": ..., "shard": ..., "down": ..., "verify": ..., "tokens_per_s": ...}, "socket": {...}}, ...}}.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from common import TimedVerify, json_line, machine, print_table, tiny_model_folder
from serve_load import TINY, run_embedded

os.environ.setdefault("HF_HUB_OFFLINE", "1")

MAX_TOKENS = 32
# carrier -> (GrpcShardGroup's session_socket, its session_spin_us), and the transport it gives
CARRIERS = {"grpc": (False, 0, "grpc"), "socket": (True, 0, "socket"), "polling": (True, 20_000, "socket")}


# ---- the shard worker ----------------------------------------------------------------------

def shard_worker(folder: str) -> None:
    """`tandem shard` (exits with its parent), its Session replies stamped into folder/stamps."""
    from tandem import shard_cli
    from tandem.rpc import server

    out = open(os.path.join(folder, "stamps"), "w", buffering=1)
    replies = server.ShardServicer._session_replies

    def stamped(self, cmd):
        got, kind = time.perf_counter(), cmd.WhichOneof("command")
        for reply in replies(self, cmd):
            ready = time.perf_counter()
            yield reply
            out.write(f"{kind} {got} {ready}\n")  # after the send: off the reply's path

    server.ShardServicer._session_replies = stamped
    shard_cli.main(["--bind", "127.0.0.1:0", "--port-file", os.path.join(folder, "addr"),
                    "--parent-pid", str(os.getppid())])


class WorkerLauncher:
    """One shard process running shard_worker (the ShardLauncher protocol)."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="tandem-legs-")
        self.proc: subprocess.Popen | None = None

    def start(self) -> list[str]:
        self.stop()
        port_file = os.path.join(self.dir, "addr")
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        with open(os.path.join(self.dir, "log"), "wb") as log:
            self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--shard-worker", self.dir],
                                         env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 120
        while not os.path.exists(port_file):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                with open(os.path.join(self.dir, "log")) as f:
                    raise RuntimeError(f"the shard worker did not start:\n{f.read()[-3000:]}")
            time.sleep(0.05)
        with open(port_file) as f:
            return [f.read().strip()]

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def stamps(self) -> list[tuple[str, float, float]]:
        with open(os.path.join(self.dir, "stamps")) as f:
            return [(kind, float(got), float(ready)) for kind, got, ready in (line.split() for line in f)]


# ---- the driver ----------------------------------------------------------------------------

def run(engine, n: int) -> float:
    """n requests at once to the end, as serve_load runs the embedded engine; tokens/s."""
    return run_embedded(engine, n, MAX_TOKENS)["tokens_per_s"]


def say(what: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {what}", file=sys.stderr, flush=True)


def pin(pid: int, cores: set[int]) -> None:
    for task in os.listdir(f"/proc/{pid}/task"):
        os.sched_setaffinity(int(task), cores)


def legs(calls: list[tuple[float, float]], stamps: list[tuple[str, float, float]]) -> dict[str, float]:
    """Median legs (ms) of the verifies whose shard stamps fall inside them."""
    verifies = sorted((got, ready) for kind, got, ready in stamps if kind == "verify")
    up, shard, down = [], [], []
    for start, end in calls:
        inside = [s for s in verifies if start <= s[0] <= end]
        if inside:
            got, ready = inside[-1]
            up.append(got - start)
            shard.append(ready - got)
            down.append(end - ready)
    med = lambda xs: 1000 * statistics.median(xs) if xs else float("nan")  # noqa: E731
    return {"up": med(up), "shard": med(shard), "down": med(down), "matched": len(up)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2", help=f"the model, or {TINY!r} (a 1-layer random model)")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--runs", type=int, default=3, help="timed runs per side and concurrency")
    ap.add_argument("--pin", default=None, metavar="CORES[/CORES]",
                    help="pin the scheduler's threads to these cores and the shard's to the second set (default: the same)")
    ap.add_argument("--carriers", nargs="+", choices=list(CARRIERS), default=list(CARRIERS),
                    help="the shard processes' Session carriers to compare with the embedded engine")
    ap.add_argument("--shard-worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.shard_worker:
        shard_worker(args.shard_worker)
        return 0

    from tandem.config import EngineConfig
    from tandem.engine import Engine
    from tandem.model.loader import load_tokenizer
    from tandem.rpc.grpc_group import GrpcShardGroup

    if args.model == TINY:
        args.model = tiny_model_folder(tempfile.mkdtemp(prefix="tandem-tiny-"))
    config = EngineConfig(model=args.model, max_num_seqs=max(args.concurrency), max_model_len=512)
    say("loading the embedded engine")
    local = Engine.from_config(config, progress=False)
    tok = load_tokenizer(config.model, progress=False)
    launchers, sides = {}, {"local": local}
    for carrier in args.carriers:
        say(f"starting the shard process ({carrier})")
        launchers[carrier] = WorkerLauncher()
        use_socket, spin_us, transport = CARRIERS[carrier]
        group = GrpcShardGroup(config.shard_spec(), launchers[carrier], session_socket=use_socket,
                               session_spin_us=spin_us)
        assert group.session_transports == [transport], group.session_transports
        sides[carrier] = Engine(group, tok.tokenizer, tok.eos_token_ids, config, model_name=tok.name)
    if args.pin:
        mine, _, theirs = args.pin.partition("/")
        pin(os.getpid(), {int(c) for c in mine.split(",")})
        for launcher in launchers.values():
            pin(launcher.proc.pid, {int(c) for c in (theirs or mine).split(",")})
    for side, engine in sides.items():
        engine.group = engine.ctx.group = TimedVerify(engine.group)
    results: dict[int, dict] = {}
    try:
        for n in args.concurrency:
            say(f"{n} at once")
            for engine in sides.values():  # warm-up: graphs of this batch's shapes, adaptive state
                run(engine, n)
            marks = {side: len(e.group.calls) for side, e in sides.items()}
            tps = {side: [] for side in sides}
            for _ in range(args.runs):
                for side, engine in sides.items():
                    tps[side].append(run(engine, n))
            results[n] = {side: (max(tps[side]), e.group.calls[marks[side]:]) for side, e in sides.items()}
    finally:
        for engine in sides.values():
            engine.close()
    stamps = {carrier: launcher.stamps() for carrier, launcher in launchers.items()}
    for launcher in launchers.values():
        shutil.rmtree(launcher.dir, ignore_errors=True)

    rows, out = [], {}
    for n, r in results.items():
        verify = {side: 1000 * statistics.median(b - a for a, b in calls) for side, (_, calls) in r.items()}
        out[f"c{n}"] = {"verify_local": verify["local"], "tokens_per_s_local": r["local"][0]}
        rows.append([n, "in process", verify["local"], None, None, None, r["local"][0], 1.0])
        for carrier in launchers:
            split = legs(r[carrier][1], stamps[carrier])
            out[f"c{n}"][carrier] = {"verify": verify[carrier], **split, "tokens_per_s": r[carrier][0]}
            rows.append([n, carrier, verify[carrier], split["up"], split["shard"], split["down"], r[carrier][0],
                         r[carrier][0] / r["local"][0]])
    print_table(["C", "where", "verify", "up", "shard", "down", "tok/s", "tok/s / in process"], rows,
                title=f"median ms a verify{' (pinned ' + args.pin + ')' if args.pin else ''}")
    json_line({"legs_ms": out, "pin": args.pin, "machine": machine()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
