"""Launchers: how a GrpcShardGroup gets its shard server processes.

A ShardLauncher (re)starts ALL ranks fresh and says where they listen; the group then
Inits them. ProcessLauncher runs `tandem shard` processes on this machine (no Ray);
the Ray launcher (tandem.actors) starts the same server in Ray actors.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Protocol


class ShardLauncher(Protocol):
    def start(self) -> list[str]:
        """(Re)start ALL ranks fresh, stopping old ones; their gRPC addresses in rank order."""
        ...

    def stop(self) -> None:
        ...


class ProcessLauncher:
    """N local `tandem shard` processes on `host`, each on a free port.

    Each child exits when this process is gone (it watches its parent pid). Its output
    goes to a log file, whose tail a start failure reports.
    """

    def __init__(
        self,
        n: int,
        *,
        host: str = "127.0.0.1",
        threads_per_rank: int | None = None,
        fault_injection: bool = False,
        start_timeout_s: float = 120.0,
        env: dict[str, str] | None = None,
    ):
        if n < 1:
            raise ValueError(f"a shard group needs at least one rank, got {n}")
        self.n = n
        self.host = host
        # ranks on one CPU share its cores; on a GPU this only sizes the host-side threads
        self.threads_per_rank = threads_per_rank or max(1, len(os.sched_getaffinity(0)) // n)
        self.fault_injection = fault_injection
        self.start_timeout_s = start_timeout_s
        self.env = env
        self.procs: list[subprocess.Popen] = []
        self.log_dir: str | None = None

    def start(self) -> list[str]:
        self.stop()
        self.log_dir = tempfile.mkdtemp(prefix="tandem-shards-")
        for rank in range(self.n):
            self.procs.append(self._spawn(rank))
        try:
            return self._wait_for_addresses()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        deadline = time.monotonic() + 5.0
        for p in self.procs:
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.procs = []
        if self.log_dir:
            shutil.rmtree(self.log_dir, ignore_errors=True)
            self.log_dir = None

    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    # ---- helpers ------------------------------------------------------------------------

    def _spawn(self, rank: int) -> subprocess.Popen:
        cmd = [
            sys.executable, "-m", "tandem.shard_cli",
            "--bind", f"{self.host}:0",
            "--port-file", self._path(rank, "addr"),
            "--parent-pid", str(os.getpid()),
            "--threads", str(self.threads_per_rank),
        ]
        if self.fault_injection:
            cmd.append("--fault-injection")
        env = dict(os.environ if self.env is None else self.env)
        src = os.path.dirname(os.path.dirname(os.path.abspath(__import__("tandem").__file__)))
        env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
        env["PYTHONUNBUFFERED"] = "1"
        with open(self._path(rank, "log"), "wb") as out:
            return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env)

    def _wait_for_addresses(self) -> list[str]:
        deadline = time.monotonic() + self.start_timeout_s
        addresses: list[str | None] = [None] * self.n
        while None in addresses:
            for rank, p in enumerate(self.procs):
                if addresses[rank] is not None:
                    continue
                if os.path.exists(self._path(rank, "addr")):
                    with open(self._path(rank, "addr")) as f:
                        addresses[rank] = f.read().strip()
                elif p.poll() is not None:
                    raise RuntimeError(f"shard rank {rank} exited with {p.returncode} before listening:\n{self.log_tail(rank)}")
            if time.monotonic() > deadline:
                missing = [r for r, a in enumerate(addresses) if a is None]
                raise TimeoutError(f"shard ranks {missing} did not listen within {self.start_timeout_s:.0f} s")
            time.sleep(0.05)
        return addresses  # type: ignore[return-value]

    def log_tail(self, rank: int, chars: int = 4000) -> str:
        try:
            with open(self._path(rank, "log"), "rb") as f:
                return f.read().decode(errors="replace")[-chars:]
        except OSError:
            return "(no log)"

    def _path(self, rank: int, kind: str) -> str:
        return os.path.join(self.log_dir, f"rank{rank}.{kind}")
