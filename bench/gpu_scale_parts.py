"""Parts of bench/gpu_scale.py: the 8B-shaped random model, an engine around it, the
synthetic drafter, and the Hugging Face transformers peer on the same weights."""
from __future__ import annotations

import random
import time

import torch

# Llama-3.1-8B's shape
LLAMA_8B = dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                num_key_value_heads=8, vocab_size=128256, rope_theta=500000.0, max_position_embeddings=8192)
SMALL = dict(hidden_size=512, intermediate_size=1536, num_hidden_layers=4, num_attention_heads=8,
             num_key_value_heads=2, vocab_size=32000, rope_theta=10000.0, max_position_embeddings=4096)


class IdTokenizer:
    """Token ids in, letters out: the engine detokenizes outputs; these prompts are ids."""

    chat_template = None

    def decode(self, ids, **_):
        return "".join(chr(97 + i % 26) for i in ids)


def hf_config(shape: dict):
    from transformers import LlamaConfig

    return LlamaConfig(**shape, rms_norm_eps=1e-5, tie_word_embeddings=False, attention_bias=False, mlp_bias=False)


def random_model(shape: dict, dtype: torch.dtype):
    """tandem's model with random weights (std 0.02, as HF initialises), built on the GPU."""
    from tandem.model.config import ModelConfig
    from tandem.model.llama import LlamaForCausalLM
    from tandem.model.loader import LoadedModel

    hf = hf_config(shape)
    cfg = ModelConfig.from_hf(hf)
    with torch.device("meta"):
        shapes = {n: p.shape for n, p in LlamaForCausalLM(cfg).state_dict().items()}
    g = torch.Generator(device="cuda").manual_seed(0)
    state = {}
    for name, size in shapes.items():
        if name.endswith("norm.weight"):
            state[name] = torch.ones(size, dtype=dtype, device="cuda")
        else:
            state[name] = (torch.randn(size, generator=g, device="cuda", dtype=torch.float32) * 0.02).to(dtype)
    model = LlamaForCausalLM.from_state_dict(cfg, state, dtype=dtype, device="cuda")
    del state
    loaded = LoadedModel(model=model, config=cfg, hf_config=hf, tokenizer=IdTokenizer(), eos_token_ids=(),
                         name="llama-3.1-8b-shaped (random)" if shape is LLAMA_8B else "small (random)",
                         chat_template=None, path="")
    return loaded


def weight_bytes(model) -> int:
    seen, total = set(), 0
    for p in model.parameters():
        if p.data_ptr() not in seen:
            seen.add(p.data_ptr())
            total += p.numel() * p.element_size()
    return total


def copy_bandwidth() -> float:
    """Bytes a second of a 4 GiB device-to-device copy (read + write counted)."""
    a = torch.empty(1 << 31, dtype=torch.bfloat16, device="cuda")
    b = torch.empty_like(a)
    for _ in range(2):
        b.copy_(a)
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        b.copy_(a)
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t)
    del a, b
    return 2 * (1 << 32) / best


def build_shard(loaded, num_slots: int, max_model_len: int, row_budget: int, kv_gb: float,
                num_speculative_tokens: int = 4):
    from tandem.shard.factory import ShardSpec, build_model_shard
    from tandem.shard.local_group import LocalShardGroup

    spec = ShardSpec(device="cuda", dtype="bfloat16", num_slots=num_slots, max_model_len=max_model_len,
                     row_budget=row_budget, num_speculative_tokens=num_speculative_tokens, kv_cache_memory_gb=kv_gb)
    shard, _ = build_model_shard(spec, loaded=loaded, progress=False)
    return LocalShardGroup(shard)


def engine_on(group, loaded, drafter: str = "none", **cfg):
    """An engine with a sink, as the scheduler actor runs it: a tick's outputs are built while
    the next forward runs on the GPU (tandem.release). Step it with step()."""
    from tandem.config import EngineConfig
    from tandem.engine import Engine

    limits = group.limits
    config = EngineConfig(drafter=drafter, max_num_seqs=limits.num_slots, max_model_len=limits.max_model_len,
                          row_budget=limits.row_budget, **cfg)
    outbox: list = []
    engine = Engine(group, loaded.tokenizer, (), config, sink=outbox.extend)
    engine.outbox = outbox
    return engine


def step(engine) -> list:
    """One tick: the outputs the sink got during it, then those step() returned."""
    returned = engine.step()
    outs = engine.outbox + returned
    engine.outbox.clear()
    return outs


class SyntheticDrafter:
    """Benchmark only: drafts that are the target's own future greedy tokens (from a run
    without speculation), each kept with probability alpha and otherwise replaced by a
    wrong token, as llama.cpp's --spec-synth-len does. Measures what the engine makes of a
    drafter of known quality, at no drafting cost."""

    name = "synthetic"
    propose_batch_max = 1 << 30
    whole_blocks = False
    copied = 0

    def __init__(self, reference: dict[str, list[int]], alpha: float, vocab: int, seed: int = 0):
        self.reference, self.alpha, self.vocab = reference, alpha, vocab
        self.rng = random.Random(seed)

    def propose(self, seqs, num_drafts):
        return [self.propose_one(s, g) for s, g in zip(seqs, num_drafts)]

    def propose_one(self, seq, num_drafts: int) -> list[int]:
        if seq.request_id not in self.reference:
            return []
        ref, p = self.reference[seq.request_id], len(seq.output_ids)
        out = []
        for j in range(num_drafts):
            t = ref[p + j] if p + j < len(ref) else 0
            out.append(t if self.rng.random() < self.alpha else (t + 1) % self.vocab)
        return out

    def on_commit(self, seq, drafted: int, accepted: int) -> None:
        pass


@torch.no_grad()
def make_greedy_robust(loaded, seed: int = 0) -> None:
    """Give the random model a next-token map with wide margins (token t -> perm[t]): the
    layers' outputs are scaled down so the residual stream stays near the input token's
    embedding, and the LM head scores token v by its similarity to the embedding of
    perm^-1[v]. Random weights leave the top logits within bf16 rounding of each other, so
    a batch of another shape picks other tokens and a greedy reference would not hold; the
    shapes, and so every cost, stay the same."""
    model = loaded.model
    for layer in model.model.layers:
        layer.self_attn.o_proj.weight.mul_(1e-3)
        layer.mlp.down_proj.weight.mul_(1e-3)
    embed = model.model.embed_tokens.weight
    g = torch.Generator(device="cuda").manual_seed(seed)
    perm = torch.randperm(embed.shape[0], generator=g, device="cuda")
    inverse = torch.empty_like(perm)
    inverse[perm] = torch.arange(perm.numel(), device="cuda")
    model.lm_head.weight.copy_(embed[inverse] * 30.0)


def hf_decode_ms(loaded, batch: int, context: int, steps: int) -> dict:
    """transformers on tandem's weights (the same tensors): static cache + torch.compile
    (generate compiles the forward itself for a static cache, CUDA graphs included), greedy
    generate of `steps` and of 8 new tokens; the step time is their difference."""
    from transformers import LlamaForCausalLM as HFLlama

    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    with torch.device("meta"):
        hf = HFLlama(loaded.hf_config)
    missing = hf.load_state_dict(dict(loaded.model.state_dict()), strict=False, assign=True).missing_keys
    assert not [k for k in missing if "rotary" not in k], missing
    hf.model.rotary_emb = LlamaRotaryEmbedding(loaded.hf_config, device="cuda")
    hf = hf.eval()
    hf.generation_config.cache_implementation = "static"
    ids = torch.randint(0, loaded.config.vocab_size, (batch, context), device="cuda")

    def run(n: int) -> float:
        torch.cuda.synchronize()
        t = time.perf_counter()
        hf.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0)
        torch.cuda.synchronize()
        return time.perf_counter() - t

    for n in (8, steps):  # compile and warm both lengths
        run(n)
    short, long = min(run(8) for _ in range(2)), min(run(steps) for _ in range(2))
    step_ms = (long - short) * 1000.0 / (steps - 8)
    return {"step_ms": step_ms, "prefill_ms": short * 1000.0 - 8 * step_ms, "total_ms": long * 1000.0}
