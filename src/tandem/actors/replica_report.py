"""What an engine replica tells the routers in front of it (tandem.serve.replica_router):
its load, whether it takes requests, and the prompt prefixes its prefix cache holds.

The step thread makes a report after every tick and sends it to every subscriber on the
actor's node over its output socket (a REPORT frame), so a router there sees the load as
of the last tick; the prefix keys ride along when they changed, at most every
PREFIXES_EVERY_S. A router elsewhere, or one that just connected, asks for the whole
report (SchedulerActor.report)."""
from __future__ import annotations

import logging
import threading
import time

from tandem.actors.output_channel import REPORT
from tandem.actors.prefix_index import PrefixIndex
from tandem.actors.prefix_keys import prefix_keys, routing_text

log = logging.getLogger("tandem.actors")

# The prefix keys (up to 4,096: ~40 kB pickled) go with a tick's report at most this often:
# a router counts what it sent meanwhile as held, and a busy engine does not pickle them every tick.
PREFIXES_EVERY_S = 0.2


def load_tokens(scheduler) -> tuple[int, int, int]:
    """(queued + running tokens, running sequences, waiting ones): the prompt tokens of
    the sequences waiting for a slot, and every token (prompt and output) of those running."""
    running = [s for s in scheduler.running if not s.finished]
    waiting = list(scheduler.waiting)
    tokens = sum(len(s.prompt_ids) + len(s.output_ids) for s in running) + sum(len(s.prompt_ids) for s in waiting)
    return tokens, len(running), len(waiting)


class ReplicaReporter:
    def __init__(self, engine, launcher, channels):
        self.engine, self.launcher, self.channels = engine, launcher, channels
        self.prefixes = PrefixIndex()
        self.draining = False
        self._lock = threading.Lock()  # the index: noted on the event loop, trimmed on the step thread
        self._last = {"load_tokens": 0, "running": 0, "waiting": 0}
        self._sent_version = -1
        self._sent_at = 0.0

    @property
    def load_tokens(self) -> int:
        return self._last["load_tokens"]

    def admitted(self, requests, admissions) -> None:
        """The event loop: note the prefixes of the requests the engine took."""
        block = self.engine.scheduler.kv.block_size
        for r, a in zip(requests, admissions):
            if not a.taken:
                continue
            keys = prefix_keys(r.prompt, r.messages)
            if keys:
                seq = self.engine.requests.get(a.request_id)
                tokens = len(seq.prompt_ids) if seq is not None else len(routing_text(r.prompt, r.messages)) // 4
                with self._lock:
                    self.prefixes.note(keys, tokens // block)

    def after_tick(self) -> None:
        """The step thread: take the load and send it on. Never raises: a report that
        fails must not stop the step loop."""
        try:
            tokens, running, waiting = load_tokens(self.engine.scheduler)
            self._last = {"load_tokens": tokens, "running": running, "waiting": waiting}
        except RuntimeError:  # an abort on another thread changed the queue meanwhile: the next tick counts
            pass
        try:
            with self._lock:
                self.prefixes.follow(self.engine.scheduler.kv.evictions, self.launcher.generation)
            self.channels.broadcast(REPORT, self.report(whole=False))
        except Exception:  # noqa: BLE001 - see above
            log.exception("replica report failed")

    def report(self, whole: bool = True) -> dict:
        """The last tick's load; the prefix keys when `whole` or changed since they were last sent."""
        out = dict(self._last, available=self.engine.available and not self.draining, draining=self.draining)
        with self._lock:
            version, now = self.prefixes.version, time.monotonic()
            if whole or (version != self._sent_version and now - self._sent_at >= PREFIXES_EVERY_S):
                out["prefixes"] = self.prefixes.keys()
                if not whole:
                    self._sent_version, self._sent_at = version, now
        return out

    def changed(self) -> None:
        """Any thread: send the report now (draining began)."""
        self.channels.broadcast(REPORT, self.report(whole=False))


async def wait_drained(live, has_work, timeout_s: float) -> int:
    """Poll until no request has an open route (`live()`) and the engine has no work, or
    timeout_s passed; how many requests are still open."""
    import asyncio

    deadline = time.monotonic() + timeout_s
    while (live() or has_work()) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    return len(live())
