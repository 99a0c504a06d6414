"""Which engine replica a request goes to: the ingress replica's view of every engine
replica (its reported load and cached prefixes) and the choice (pick).

Load is what the engine replica reports after every tick (tandem.actors.replica_report:
queued + running tokens), plus what this router sent it since that the reports cannot
have counted yet: a burst taken in between two ticks spreads instead of piling onto the
replica that looked idle. A request's prefix keys (tandem.actors.prefix_keys) that a
replica holds send it there, unless that replica's load is more than
`prefix_overload_tokens` above the least loaded one's; otherwise the least loaded
replica gets it (ties: the one this router sent fewer requests)."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from tandem.actors.prefix_keys import routing_text

_SETTLE_REPORTS = 2  # reports after which a request sent is in the engine's own count


def request_cost(prompt, messages) -> int:
    """About how many tokens a request adds to its replica's load before its first report."""
    if isinstance(prompt, list) and messages is None:
        return len(prompt) + 1
    return len(routing_text(prompt, messages)) // 4 + 1


@dataclass
class Replica:
    name: str  # its scheduler actor's name
    handle: object  # a multiplexed TandemHandle on it
    load: int = 0  # queued + running tokens, as last reported
    available: bool = True  # not recovering, not draining (as last reported)
    draining: bool = False
    down: bool = False  # its actor or its output stream is gone
    prefixes: set = field(default_factory=set)
    reports: int = 0
    unreported: dict = field(default_factory=dict)  # request id -> (cost, reports when sent)
    routed: Counter = field(default_factory=Counter)  # reason -> requests sent here

    @property
    def serving(self) -> bool:
        return self.available and not self.down and not self.draining

    def estimate(self) -> int:
        return self.load + sum(cost for cost, _ in self.unreported.values())

    def on_report(self, report: dict) -> None:
        self.reports += 1
        self.load = report["load_tokens"]
        self.available, self.draining = report["available"], report["draining"]
        if "prefixes" in report:
            self.prefixes = set(report["prefixes"])
        if self.unreported:
            self.unreported = {rid: v for rid, v in self.unreported.items() if self.reports - v[1] < _SETTLE_REPORTS}

    def sent(self, rid: str, cost: int, keys: list[int], reason: str) -> None:
        self.unreported[rid] = (cost, self.reports)
        self.prefixes.update(keys)  # its next reports say whether it kept them
        self.routed[reason] += 1

    def settled(self, rid: str) -> None:
        self.unreported.pop(rid, None)

    def held_depth(self, keys: list[int]) -> int:
        """How many of the leading prefix keys this replica holds."""
        for i in range(len(keys), 0, -1):
            if keys[i - 1] in self.prefixes:
                return i
        return 0


class ReplicaRouter:
    def __init__(self, prefix_routing: bool = True, prefix_overload_tokens: int = 8192):
        self.replicas: dict[str, Replica] = {}
        self.prefix_routing = prefix_routing
        self.prefix_overload_tokens = prefix_overload_tokens

    def serving(self) -> list[Replica]:
        return [r for r in self.replicas.values() if r.serving]

    def pick(self, keys: list[int], skip: set[str] = frozenset()) -> tuple[Replica | None, str]:
        """The replica for a request with these prefix keys, and why ("prefix" or "load");
        None when no replica serves (or all were tried: `skip`)."""
        up = [r for r in self.serving() if r.name not in skip]
        if not up:
            return None, "none"
        least = min(up, key=lambda r: (r.estimate(), sum(r.routed.values())))
        if self.prefix_routing and keys:
            depth, holder = max(((r.held_depth(keys), r) for r in up), key=lambda x: (x[0], -x[1].estimate()))
            if depth and (holder is least or holder.estimate() - least.estimate() <= self.prefix_overload_tokens):
                return holder, "prefix"
        return least, "load"
