"""The timed runs of bench/spec_speedup.py: requests through tandem engines that share one
loaded target, transformers' greedy and assisted generate on the same prompts, and
Leviathan et al.'s predicted speedup from a run's acceptance and the draft/target cost."""
from __future__ import annotations

from dataclasses import dataclass, field

from common import interleaved_min, now
from spec_speedup_cases import Drafter


@dataclass
class Run:
    """Requests run to completion on one engine; times in seconds."""

    tokens: int = 0
    seconds: float = 0.0
    decode_tokens: int = 0  # tokens after each group's first tick (prefill and first verify)
    decode_seconds: float = 0.0
    drafts: int = 0
    draft_tokens: int = 0
    accepted: int = 0
    outputs: list = field(default_factory=list)  # token ids per request, in prompt order
    by_kind: dict = field(default_factory=dict)  # kind -> [tokens, seconds] (batch 1 only)

    @property
    def tok_s(self) -> float:
        return self.tokens / self.seconds

    @property
    def decode_tok_s(self) -> float:
        return self.decode_tokens / self.decode_seconds if self.decode_seconds else 0.0

    @property
    def acceptance_length(self) -> float:
        return 1.0 + self.accepted / self.drafts if self.drafts else 1.0


def run_engines(engines: dict, prompts: list[tuple[str, str]], params, batch: int) -> dict[str, Run]:
    """All prompts through every engine. Batch 1: one after another, the engines taking
    turns prompt by prompt, so a noisy stretch of a shared machine hits them alike. Batch
    b > 1: b requests in flight, a new one joining as one finishes (continuous batching),
    each engine in turn over the whole list."""
    runs = {name: Run() for name in engines}
    if batch > 1:
        for name, engine in engines.items():
            _run_chunk(engine, prompts, params, runs[name], by_kind=False, in_flight=batch)
        return runs
    for i in range(0, len(prompts), batch):
        for name, engine in engines.items():
            _run_chunk(engine, prompts[i : i + batch], params, runs[name], by_kind=batch == 1)
    return runs


def _run_chunk(engine, chunk: list[tuple[str, str]], params, run: Run, by_kind: bool, in_flight: int | None = None) -> None:
    """The chunk's requests to completion: all at once, or `in_flight` at a time."""
    t0 = now()
    waiting = [text for _, text in chunk]
    ids = [engine.add_request(text, params) for text in waiting[: in_flight or len(waiting)]]
    waiting = waiting[len(ids) :]
    final, first_tick = {}, None
    while len(final) < len(chunk):
        outs = engine.step()
        if first_tick is None:  # prefill (and the first verify): left out of the decode rate
            first_tick = (now(), sum(len(o.token_ids) for o in outs))
        for o in outs:
            if o.finished:
                final[o.request_id] = o
                if waiting:  # its slot goes to the next request
                    ids.append(engine.add_request(waiting.pop(0), params))
    t1 = now()
    outs = [final[r] for r in ids]
    tokens = sum(len(o.token_ids) for o in outs)
    run.tokens += tokens
    run.seconds += t1 - t0
    run.decode_tokens += tokens - first_tick[1]
    run.decode_seconds += t1 - first_tick[0]
    for o in outs:
        if o.error:
            raise RuntimeError(f"request {o.request_id} failed: {o.error}")
        run.outputs.append(list(o.token_ids))
        run.drafts += o.num_drafts
        run.draft_tokens += o.num_draft_tokens
        run.accepted += o.num_accepted_tokens
    if by_kind:
        acc = run.by_kind.setdefault(chunk[0][0], [0, 0.0])
        acc[0] += tokens
        acc[1] += t1 - t0


class Target:
    """One loaded target model and the shard groups that engines on it share: engines whose
    ranks look alike (no rank-side drafter, or the same one) share one group."""

    def __init__(self, spec: str | None, *, slots: int, max_model_len: int, device: str, dtype: str):
        from tandem.config import EngineConfig
        from tandem.shard.factory import build_model_shard

        # No prefix cache: the engines of a group take turns on one rank's KV pool, each with
        # a block allocator of its own, so blocks one engine cached another may overwrite.
        self.base = EngineConfig(model=spec, drafter="none", max_num_seqs=slots, max_model_len=max_model_len,
                                 row_budget=max(256, 8 * slots), device=device, dtype=dtype,
                                 enable_prefix_caching=False)
        t = now()
        shard, self.loaded = build_model_shard(self.base.shard_spec(), progress=False)
        self.load_s = now() - t
        self.groups = {self.base.shard_spec(): _local(shard)}

    def group_for(self, cfg) -> object:
        from tandem.shard.factory import build_model_shard

        key = cfg.shard_spec()
        if key not in self.groups:
            self.groups[key] = _local(build_model_shard(key, loaded=self.loaded, progress=False)[0])
        return self.groups[key]

    def engine(self, **fields):
        from dataclasses import replace

        from tandem.engine import Engine

        cfg = replace(self.base, **fields)
        return Engine(self.group_for(cfg), self.loaded.tokenizer, self.loaded.eos_token_ids, cfg, model_name=self.loaded.name)

    def render(self, prompts: list[tuple[str, list[dict]]]) -> list[tuple[str, str]]:
        tok = self.loaded.tokenizer
        return [(kind, tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)) for kind, msgs in prompts]


def _local(shard):
    from tandem.shard.local_group import LocalShardGroup

    return LocalShardGroup(shard)


def one_row_ms(models: dict, position: int, reps: int = 5) -> dict[str, float]:
    """Milliseconds of one single-row forward at `position` (the cache's first blocks;
    timing only) of each (model, cache), the models taking turns."""
    import torch

    from tandem.model.kv_cache import fixed_tables

    def step(model, cache):
        device = model.device
        tokens = torch.zeros(1, 1, dtype=torch.long, device=device)
        start = torch.tensor([position], dtype=torch.int32, device=device)
        tables = fixed_tables(1, position + 1, cache.block_size, device)

        def run():
            model(tokens, start, cache, tables)
            sync(device)
        return run

    with torch.inference_mode():
        t = interleaved_min({name: step(m, c) for name, (m, c) in models.items()}, reps=reps, warmup=2)
    return {name: v * 1e3 for name, v in t.items()}


def sync(device) -> None:
    import torch

    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def leviathan(acceptance_length: float, gamma: float, c: float) -> dict:
    """Leviathan et al.: with per-token acceptance a and g drafts a round, a round yields
    (1 - a^(g+1)) / (1 - a) tokens for the cost of g draft forwards (c each, in target
    forwards) and one target forward. a is found from the measured acceptance length."""
    def tokens(a: float) -> float:
        return gamma + 1.0 if a >= 1.0 else (1.0 - a ** (gamma + 1.0)) / (1.0 - a)

    lo, hi = 0.0, 1.0
    for _ in range(60):  # tokens(a) grows with a: bisect
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if tokens(mid) < acceptance_length else (lo, mid)
    a = (lo + hi) / 2
    return {"alpha": a, "gamma": gamma, "c": c, "predicted": tokens(a) / (gamma * c + 1.0)}


def leviathan_check(fixed: Run, base: Run, engine, target: Target, prompt: str, max_tokens: int) -> dict:
    """Leviathan et al.'s predicted speedup from the fixed-gamma run's acceptance and the
    measured draft/target cost ratio c (one-row forwards of each model, taking turns),
    against the measured decode speedup."""
    shard = engine.group.shard
    position = len(target.loaded.tokenizer(prompt).input_ids) + max_tokens // 2  # a typical decode position
    t = one_row_ms({"target": (shard.model, shard.cache), "draft": (shard.drafter.model, shard.drafter.cache)}, position)
    lev = leviathan(fixed.acceptance_length, fixed.draft_tokens / max(1, fixed.drafts), t["draft"] / t["target"])
    lev["measured"] = fixed.decode_tok_s / base.decode_tok_s
    lev["fraction"] = lev["measured"] / lev["predicted"]
    lev["draft_ms"], lev["target_ms"] = t["draft"], t["target"]
    lev["acceptance_length"], lev["e2e_speedup"] = fixed.acceptance_length, fixed.tok_s / base.tok_s
    return lev


def hf_runs(d: Drafter, prompts: list[tuple[str, str]], max_tokens: int, device, dtype) -> dict:
    """transformers' greedy generate and its assisted generation at batch 1: tokens/s and outputs."""
    import torch
    from transformers import AutoModelForCausalLM

    from tandem.model.loader import load_tokenizer

    info = load_tokenizer(d.target, progress=False)  # the folder, tokenizer and stop ids; no weights
    model = AutoModelForCausalLM.from_pretrained(info.path, dtype=dtype).to(device).eval()
    assist = dict(d.hf_assist)
    if "assistant_model" in assist:
        folder = load_tokenizer(assist["assistant_model"], progress=False).path
        assist["assistant_model"] = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).to(device).eval()
    tok, eos = info.tokenizer, list(info.eos_token_ids)
    kw = dict(max_new_tokens=max_tokens, do_sample=False, temperature=None, top_p=None, top_k=None,
              eos_token_id=eos, pad_token_id=eos[0])
    out = {}
    for mode, extra in (("greedy", {}), ("assisted", assist)) if assist else (("greedy", {}),):
        tokens, seconds, outputs = 0, 0.0, []
        with torch.inference_mode():
            model.generate(**tok(prompts[0][1], return_tensors="pt").to(device), **{**kw, "max_new_tokens": 4}, **extra)
            for _, text in prompts:
                enc = tok(text, return_tensors="pt").to(device)
                t = now()
                ids = model.generate(**enc, **kw, **extra)
                sync(device)
                seconds += now() - t
                new = ids[0, enc.input_ids.shape[1] :].tolist()
                tokens += len(new)
                outputs.append(new)
        out[mode] = {"tok_s": tokens / seconds, "tokens": tokens, "seconds": seconds, "outputs": outputs}
    return out
