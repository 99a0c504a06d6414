"""Telemetry: Prometheus counters under vLLM's names (speculative decoding, the KV cache,
the scheduler), plus timings.

Each Engine owns a registry (tests build many engines in one process); a server
exposes it with prometheus_client.generate_latest(engine.metrics.registry).
"""
from __future__ import annotations

import logging

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

log = logging.getLogger("tandem.verify")

_MS_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000)
_LATENCY_S_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
_PER_TOKEN_S_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)


class EngineMetrics:
    def __init__(self, registry: CollectorRegistry | None = None, max_positions: int = 16):
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.num_drafts = Counter("tandem:spec_decode_num_drafts", "Verify rounds that carried drafts.", registry=r)
        self.num_draft_tokens = Counter("tandem:spec_decode_num_draft_tokens", "Draft tokens proposed and verified.", registry=r)
        self.num_accepted_tokens = Counter("tandem:spec_decode_num_accepted_tokens", "Draft tokens accepted.", registry=r)
        self.accepted_per_pos = Counter(
            "tandem:spec_decode_num_accepted_tokens_per_pos",
            "Accepted draft tokens by draft position.",
            ["position"],
            registry=r,
        )
        self.verify_ms = Histogram("tandem:verify_ms", "Milliseconds of one batched verify forward.", buckets=_MS_BUCKETS, registry=r)
        self.propose_ms = Histogram("tandem:propose_ms", "Milliseconds of one batched propose.", buckets=_MS_BUCKETS, registry=r)
        self.grammar_cut_tokens = Counter("tandem:spec_decode_num_grammar_cut_tokens",
                                          "Draft tokens cut before the verify because the grammar refuses them.", registry=r)
        self.copied_drafts = Counter("tandem:spec_decode_num_copied_drafts",
                                     "Sequence rounds drafted by n-gram lookup ahead of the model drafter (copy first).",
                                     registry=r)
        self.generated_tokens = Counter("tandem:generation_tokens", "Tokens emitted to clients.", registry=r)
        self.prompt_tokens = Counter("tandem:prompt_tokens", "Prompt tokens prefilled.", registry=r)
        self.requests_finished = Counter("tandem:request_success", "Requests finished, by reason.", ["finished_reason"], registry=r)
        self.verify_failures = Counter("tandem:verify_failures", "Verify forwards that failed.", registry=r)
        # request latencies as the engine sees them (from add_request; HTTP and Ray not included)
        self.queue_time = Histogram("tandem:request_queue_time_seconds", "Seconds from arrival to the start of the prefill.",
                                    buckets=_LATENCY_S_BUCKETS, registry=r)
        self.time_to_first_token = Histogram("tandem:time_to_first_token_seconds", "Seconds from arrival to the first token.",
                                             buckets=_LATENCY_S_BUCKETS, registry=r)
        self.time_per_output_token = Histogram(
            "tandem:request_time_per_output_token_seconds",
            "Per finished request: seconds from its first token to its last, over its tokens after the first.",
            buckets=_PER_TOKEN_S_BUCKETS, registry=r)
        self.e2e_latency = Histogram("tandem:e2e_request_latency_seconds",
                                     "Seconds from arrival to the end, of requests that finished (stop or length).",
                                     buckets=_LATENCY_S_BUCKETS, registry=r)
        # the KV pool and the scheduler, under vLLM's names
        self.kv_cache_usage = Gauge("tandem:kv_cache_usage_perc", "Share of the KV pool's blocks held by sequences (0..1).", registry=r)
        self.prefix_cache_queries = Counter("tandem:prefix_cache_queries", "Prompt tokens looked up in the prefix cache.", registry=r)
        self.prefix_cache_hits = Counter("tandem:prefix_cache_hits", "Prompt tokens found in the prefix cache (not prefilled).", registry=r)
        self.num_preemptions = Counter("tandem:num_preemptions", "Running sequences preempted for KV blocks.", registry=r)
        self.num_requests_running = Gauge("tandem:num_requests_running", "Sequences running (holding a slot and KV blocks).", registry=r)
        self.num_requests_waiting = Gauge("tandem:num_requests_waiting", "Sequences waiting for a slot or KV blocks.", registry=r)
        self._preemptions_seen = 0
        self.max_positions = max_positions
        self._accepted_at: dict[int, object] = {}  # position -> its labelled child, made when first counted

    def record_prefix_hit(self, tokens: int, cached: int) -> None:
        self.prefix_cache_queries.inc(tokens)
        self.prefix_cache_hits.inc(cached)

    def record_scheduler(self, scheduler) -> None:
        """The gauges after a tick, and the preemptions it made."""
        self.kv_cache_usage.set(scheduler.kv.usage())
        self.num_requests_running.set(len(scheduler.running))
        self.num_requests_waiting.set(len(scheduler.waiting))
        self.num_preemptions.inc(scheduler.num_preemptions - self._preemptions_seen)
        self._preemptions_seen = scheduler.num_preemptions

    def record_verify(self, drafted: list[int], accepted: list[int]) -> None:
        """drafted[i], accepted[i]: one sequence's draft count and accepted count this round."""
        # one increment a counter a round, not one a sequence: this runs on every tick
        rounds, at_pos = 0, [0] * self.max_positions
        for g, a in zip(drafted, accepted):
            if g:
                rounds += 1
                for pos in range(min(a, self.max_positions)):
                    at_pos[pos] += 1
        if not rounds:
            return
        self.num_drafts.inc(rounds)
        self.num_draft_tokens.inc(sum(drafted))
        self.num_accepted_tokens.inc(sum(a for g, a in zip(drafted, accepted) if g))
        for pos, count in enumerate(at_pos):
            if count:
                child = self._accepted_at.get(pos)
                if child is None:
                    child = self._accepted_at[pos] = self.accepted_per_pos.labels(position=str(pos))
                child.inc(count)

    def record_finished(self, arrival: float, first_token: float | None, tokens: int, now: float) -> None:
        """A request that ended by stop or length: its end-to-end and per-token latency."""
        self.e2e_latency.observe(now - arrival)
        if first_token is not None and tokens > 1:
            self.time_per_output_token.observe((now - first_token) / (tokens - 1))

    def log_tick(self, n: int, g: int, accepted: int, drafted: int, verify_ms: float, propose_ms: float) -> None:
        # The seed's per-batch line: n, gamma, accepted/drafted, verify and propose ms.
        pct = 100.0 * accepted / drafted if drafted else 0.0
        log.info(
            "BATCHED verify: n=%d g=%d accepted=%d/%d (%.0f%%) verify=%.1fms propose=%.1fms",
            n, g, accepted, drafted, pct, verify_ms, propose_ms,
        )
