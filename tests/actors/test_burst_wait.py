"""wait_for_burst: the scheduler actor's first tick after an idle spell waits for the rest
of a burst of arrivals (real threads; bounds loose enough for a loaded machine)."""
from __future__ import annotations

import threading
import time

from tandem.actors.scheduler_actor import wait_for_burst


def _arrive_every(event: threading.Event, every_s: float, until_s: float) -> threading.Thread:
    def run():
        end = time.perf_counter() + until_s
        while time.perf_counter() < end:
            time.sleep(every_s)
            event.set()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_it_waits_until_the_arrivals_stop():
    arrival = threading.Event()
    arrivals = _arrive_every(arrival, 0.005, 0.2)
    t0 = time.perf_counter()
    wait_for_burst(arrival, gap_s=0.15, most_s=5.0)
    waited = time.perf_counter() - t0
    arrivals.join()
    assert 0.2 <= waited < 5.0


def test_it_waits_no_longer_than_its_limit_under_steady_arrivals():
    arrival = threading.Event()
    _arrive_every(arrival, 0.005, 3.0)
    t0 = time.perf_counter()
    wait_for_burst(arrival, gap_s=0.15, most_s=0.3)
    waited = time.perf_counter() - t0
    assert 0.3 <= waited < 2.0


def test_no_gap_means_no_wait():
    arrival = threading.Event()
    arrival.set()
    t0 = time.perf_counter()
    wait_for_burst(arrival, gap_s=0.0, most_s=5.0)
    assert time.perf_counter() - t0 < 0.5
    assert arrival.is_set()  # left alone: the arrival that woke the loop still counts
