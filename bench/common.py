"""What the benchmarks share: torch setup, timing that survives a noisy machine, a
printed table, and the one JSON line every benchmark ends with.

Timing: the machine may be shared, so interference only ever adds time. Each
candidate is timed several times, the candidates of one comparison interleaved
(round robin) so that a noisy stretch hits them alike, and the minimum is kept.
"""
from __future__ import annotations

import json
import os
import platform
import shutil
import sys
import time
from collections.abc import Callable, Sequence

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # no model hub here: never reach for it


def setup_torch(threads: int | None) -> int:
    """Set torch's intra-op threads (default: every core, which is 2 here) and return the count."""
    import torch

    threads = threads or os.cpu_count() or 1
    torch.set_num_threads(threads)
    return threads


def now() -> float:
    return time.perf_counter()


def load() -> float:
    """The 1-minute load average (0.0 where the platform has none)."""
    try:
        return os.getloadavg()[0]
    except OSError:
        return 0.0


def machine() -> dict:
    """What the numbers were measured on, for the JSON line."""
    import torch

    return {
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "device": "cuda:" + torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "load_1min": round(load(), 2),
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }


def warn_if_busy(stream=sys.stderr) -> None:
    cores = os.cpu_count() or 1
    if load() > 0.75 * cores:
        print(f"note: load average {load():.1f} on {cores} cores: other processes compete for the CPU; "
              "timings will be noisy and slow (interference only adds time: the minima are kept)", file=stream)


def interleaved_min(fns: dict[str, Callable[[], object]], reps: int, warmup: int = 1) -> dict[str, float]:
    """Seconds of each callable: the minimum of `reps` runs, the callables taking turns."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    best = {name: float("inf") for name in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            t = now()
            fn()
            best[name] = min(best[name], now() - t)
    return best


def copy_suffix(drafter: str) -> tuple[str, int | None]:
    """A benchmark's drafter entry "NAME+copyN" -> (NAME, copy_min_ngram N); without the
    suffix, (NAME, None): the engine's default."""
    name, _, copy = drafter.partition("+copy")
    return name, int(copy) if copy else None


def print_table(headers: Sequence[str], rows: Sequence[Sequence[object]], title: str | None = None, stream=sys.stdout) -> None:
    """A plain fixed-width table; floats get 3 significant decimals."""

    def cell(v: object) -> str:
        if isinstance(v, float):
            return f"{v:.3f}" if abs(v) < 10 else f"{v:.1f}"
        return "-" if v is None else str(v)

    cells = [[cell(v) for v in r] for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]
    if title:
        print(title, file=stream)
    print("  ".join(h.rjust(w) for h, w in zip(headers, widths)), file=stream)
    print("  ".join("-" * w for w in widths), file=stream)
    for r in cells:
        print("  ".join(c.rjust(w) for c, w in zip(r, widths)), file=stream)
    print(file=stream)


def rounded(obj, digits: int = 3):
    """Floats of a nested dict/list rounded for the JSON line."""
    if isinstance(obj, float):
        return round(obj, digits)
    if isinstance(obj, dict):
        return {k: rounded(v, digits) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [rounded(v, digits) for v in obj]
    return obj


def json_line(obj: dict) -> None:
    """The benchmark's result: one JSON object on the last line of stdout."""
    sys.stdout.flush()
    print(json.dumps(rounded(obj), sort_keys=False), flush=True)


class TimedVerify:
    """Wraps a shard group: (start, end) of every verify, and the milliseconds spent in
    verify since the last take()."""

    def __init__(self, group):
        self.group, self.calls, self._taken = group, [], 0

    def __getattr__(self, name):
        return getattr(self.group, name)

    def verify(self, cmd):
        t = time.perf_counter()
        try:
            return self.group.verify(cmd)
        finally:
            self.calls.append((t, time.perf_counter()))

    def take(self) -> float:
        ms = sum(end - start for start, end in self.calls[self._taken :]) * 1000.0
        self._taken = len(self.calls)
        return ms


def fixed_block_tables(num_seqs: int, positions: int, block_size: int) -> list[list[int]]:
    """Block tables for a fixed batch sent to a shard without a scheduler: sequence i owns
    the blocks of row i of tandem.model.kv_cache.fixed_tables (each up to `positions`)."""
    from tandem.model.kv_cache import fixed_tables

    return fixed_tables(num_seqs, positions, block_size).tolist()


def covering(table: list[int], positions: int, block_size: int) -> list[int]:
    """The blocks of `table` that hold positions 0..positions-1: the table a scheduler
    sends for a sequence of that length (a verify's graph bucket follows its length)."""
    return table[: -(-positions // block_size)]


def tiny_model_folder(out: str) -> str:
    """The default model's tokenizer and vocabulary on a 1-layer random Llama."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from tandem.model.loader import resolve_model_folder

    _, src = resolve_model_folder(None)
    for f in os.listdir(src):
        if f.startswith("tokenizer") or f in ("special_tokens_map.json", "generation_config.json"):
            shutil.copy(os.path.join(src, f), os.path.join(out, f))
    with open(os.path.join(src, "config.json")) as fh:
        base = json.load(fh)
    cfg = LlamaConfig(vocab_size=base["vocab_size"], hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                      bos_token_id=base.get("bos_token_id"), eos_token_id=base.get("eos_token_id"),
                      tie_word_embeddings=True)
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).save_pretrained(out)
    return out
