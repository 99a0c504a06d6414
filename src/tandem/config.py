"""EngineConfig: how an engine is built, checked when built. The one set of defaults:
ShardSpec (tandem.shard.spec) takes its own from here."""
from __future__ import annotations

import os
from dataclasses import Field, dataclass, field, fields
from typing import Literal

from tandem.drafters.registry import DrafterName, default_drafter, drafter_kind
from tandem.errors import InvalidRequestError

DEFAULT_NUM_SPECULATIVE_TOKENS = 4  # when the drafter has no block size of its own
MAX_NUM_SPECULATIVE_TOKENS = 16


def option(default, help: str, **bounds):
    """A config field with its help text and bounds (ge, le): the README's configuration
    table and the served app's arguments (tandem.serve.args) are derived from them."""
    return field(default=default, metadata={"help": help, **bounds})


def env_option(variable: str, parse, help: str):
    """A field whose default comes from the environment variable `variable`, read here only."""
    return field(default_factory=lambda: parse(os.environ.get(variable)), metadata={"help": help, "env": variable})


def _on_unless_zero(value: str | None) -> bool:
    return value != "0"


class _DefaultDrafter(str):
    """A drafter the config chose, not the user: dataclasses.replace(config, model=...)
    passes it on, and __post_init__ then chooses again for the new model."""


class _DefaultGamma(int):
    """A num_speculative_tokens the config chose, not the user: dataclasses.replace(config,
    drafter=...) passes it on, and __post_init__ then chooses again for the new drafter."""


@dataclass(frozen=True)
class EngineConfig:
    model: str | None = option(None, "Target model: a known name (smollm2, qwen2.5-coder-0.5b, qwen2.5-coder-1.5b), a local folder, a .gguf file, or a hub name. None = SmolLM2-135M-Instruct.")
    drafter: DrafterName | None = option(None, "Who proposes drafts: none, ngram, draft-model or dflash. None = dflash where there are DFlash weights for the model (dflash_checkpoint given, or the weights tandem ships, as for the default model), else ngram.")
    draft_model: str | None = option(None, "The draft model for drafter='draft-model'; must share the target's tokenizer.")
    dflash_checkpoint: str | None = option(None, "For drafter='dflash': a checkpoint folder (config.json + *.safetensors); None = the weights shipped for the model.")
    num_speculative_tokens: int | None = option(None, "Most drafts a sequence gets per round; None = block_size - 1 of the DFlash checkpoint for drafter='dflash', else 4.", ge=0, le=MAX_NUM_SPECULATIVE_TOKENS)
    adaptive: bool = option(True, "Adapt the draft count per sequence (by its acceptance) and cap it per batch (by measured forward costs).")
    max_num_seqs: int = option(32, "Sequences running at once.", ge=1, le=4096)
    max_model_len: int | None = option(None, "Positions of one sequence (prompt + output); None = the model's context length, limited by the KV pool.", ge=2, le=1048576)
    block_size: int = option(16, "Positions of one KV block (the unit of KV memory and of prefix sharing).", ge=1, le=1024)
    kv_cache_memory_gb: float | None = option(None, "The KV pool of each rank in GiB; None = what gpu_memory_utilization leaves on a GPU, 2 GiB on the CPU (memory is taken as blocks are first written).", gt=0)
    gpu_memory_utilization: float = option(0.9, "Share of the GPU's memory the rank may use (weights, activations, KV pool) when kv_cache_memory_gb is None.", gt=0, le=1)
    enable_prefix_caching: bool = option(True, "Share the KV of full blocks of identical prompt prefixes across requests.")
    max_prefill_tokens: int = option(2048, "Most prompt tokens prefilled in one tick: longer prompts, or a burst of them, are prefilled in chunks over several ticks, and running sequences keep decoding between the chunks.", ge=1)
    prefill_stall: float = option(1.0, "While sequences stream, the prompts of later requests are prefilled, in forwards of their own, at most this many times the running batch's verify forward a tick (priced by measured forward costs; at most max_prefill_tokens): under a burst of new prompts the running streams' inter-token gaps grow about 1 + prefill_stall times (more where padding to a CUDA graph's shape costs more than priced). Requests sent together are prefilled at full width. 0: only max_prefill_tokens bounds a tick's prefill. Chunks riding on a verify (mixed_prefill) are bounded by row_budget instead.", ge=0)
    mixed_prefill: bool | None = option(None, "While sequences run, prompt chunks ride on their verify forward (at most row_budget prompt tokens a tick, beside the verify's rows): a burst of new prompts delays running streams by the chunks' compute, not by forwards of their own. False: a tick prefills up to max_prefill_tokens prompt tokens in a forward of their own, then verifies. Default: on where the target runs eagerly (CPU, tensor parallel, cuda_graphs off); off on a GPU rank with CUDA graphs, where the riding forward, run eagerly, costs more than the verify's graph and a graphed prefill together.")
    row_budget: int = option(256, "Most rows in one target forward (n sequences x k rows).", ge=1, le=65536)
    shards: int = option(1, "Target ranks: 1 = in this process, N > 1 = N local gRPC shard processes (tensor parallel).", ge=1, le=64)
    device: str = option("auto", "auto (a GPU when there is one), cpu, cuda.")
    dtype: Literal["auto", "float32", "bfloat16"] = option("auto", "Weights dtype: auto (bf16 on a GPU, float32 on the CPU), float32, bfloat16.")
    quantization: Literal["auto", "none", "int8", "int4", "fp8"] = option("auto", "Quantized linear layers: auto (int4 on the CPU for weights that ship quantized, such as the default model's GGUF, unless dtype is float32; none otherwise), none, int8 (CPU: int8 weights and activations), int4 (CPU or GPU: int4 weights; on the CPU the LM head int8 where the CPU has VNNI or AMX, else float), fp8 (GPU: E4M3 weights and activations).")
    max_verify_failures: int = option(3, "Tries of a verify that failed in an in-process rank without advancing anything (retried next tick) before its batch ends with finish_reason 'error'.", ge=1)
    ngram_max: int = option(4, "Longest n-gram the ngram drafter looks up in the context.", ge=1)
    ngram_min: int = option(1, "Shortest n-gram the ngram drafter looks up.", ge=1)
    copy_min_ngram: int | None = option(None, "With a model drafter: a sequence whose last copy_min_ngram tokens recur earlier in its context drafts what followed them there (n-gram prompt lookup, matching up to ngram_max tokens), the model the rest of the batch; where outputs copy their context (rewrites, translations, code and passages quoted back) the copy is the better draft. 0: the model drafts every sequence. None = 2 with drafter='dflash', 0 with 'draft-model'.", ge=0)
    cuda_graphs: bool = env_option("TANDEM_CUDA_GRAPHS", _on_unless_zero, "CUDA graphs for the target's verify and prefill forwards on one GPU rank (a tensor-parallel target always runs eagerly). Default: on unless TANDEM_CUDA_GRAPHS=0.")
    dflash_cuda_graphs: bool = env_option("TANDEM_DFLASH_CUDA_GRAPHS", _on_unless_zero, "CUDA graphs for the DFlash drafter's forwards. Default: on unless TANDEM_DFLASH_CUDA_GRAPHS=0.")
    dflash_dtype: str | None = env_option("TANDEM_DFLASH_DTYPE", lambda v: v or None, "The DFlash drafter's dtype (float32, bfloat16); None = the target's (bf16 beside a float32 target on a CPU with bf16 matmuls). Default: TANDEM_DFLASH_DTYPE.")

    def __post_init__(self) -> None:
        if self.drafter is None or isinstance(self.drafter, _DefaultDrafter):
            object.__setattr__(self, "drafter", _DefaultDrafter(default_drafter(self.model, self.dflash_checkpoint)))
        kind = drafter_kind(self.drafter)
        if kind.needs_draft_model and not self.draft_model:
            raise InvalidRequestError("draft_model", f"drafter {kind.name!r} needs a draft model")
        if self.copy_min_ngram and not kind.on_rank:
            raise InvalidRequestError("copy_min_ngram", f"applies to a model drafter (draft-model, dflash), not {kind.name!r}")
        self._resolve_speculative_tokens()
        for f in fields(self):
            check_bounds(f, getattr(self, f.name))
        if self.row_budget < self.num_speculative_tokens + 1:
            raise InvalidRequestError("row_budget", "must fit one sequence's rows (num_speculative_tokens + 1)")

    def _resolve_speculative_tokens(self) -> None:
        gamma = self.num_speculative_tokens
        chosen = gamma is None or isinstance(gamma, _DefaultGamma)
        kind = drafter_kind(self.drafter)
        if kind.checkpoint is None:
            if chosen:
                object.__setattr__(self, "num_speculative_tokens", _DefaultGamma(DEFAULT_NUM_SPECULATIVE_TOKENS))
            return
        # an absolute folder: shard processes (Ray actors included) may run in another cwd
        folder, most = kind.checkpoint(self.model, self.dflash_checkpoint)
        if self.dflash_checkpoint is not None:
            object.__setattr__(self, "dflash_checkpoint", folder)
        if chosen:
            object.__setattr__(self, "num_speculative_tokens", _DefaultGamma(min(most, MAX_NUM_SPECULATIVE_TOKENS)))
        elif gamma > most:
            raise InvalidRequestError(
                "num_speculative_tokens",
                f"the DFlash checkpoint {folder} drafts at most block_size - 1 = {most} tokens, got {gamma}",
            )

    @property
    def rank_drafter(self) -> str:
        """The drafter the shard ranks carry ("none" when the scheduler drafts)."""
        return str(self.drafter) if drafter_kind(self.drafter).on_rank else "none"

    def shard_spec(self):
        from tandem.shard.spec import ShardSpec

        return ShardSpec(
            model=self.model,
            dtype=self.dtype,
            device=self.device,
            num_slots=self.max_num_seqs,
            max_model_len=self.max_model_len,
            row_budget=self.row_budget,
            drafter=self.rank_drafter,
            draft_model=self.draft_model,
            dflash_checkpoint=self.dflash_checkpoint if drafter_kind(self.drafter).checkpoint else None,
            num_speculative_tokens=int(self.num_speculative_tokens),
            cuda_graphs=self.cuda_graphs,
            dflash_cuda_graphs=self.dflash_cuda_graphs,
            dflash_dtype=self.dflash_dtype,
            block_size=self.block_size,
            kv_cache_memory_gb=self.kv_cache_memory_gb,
            gpu_memory_utilization=self.gpu_memory_utilization,
            quantization=self.quantization,
        )


def check_bounds(f: Field, value) -> None:
    """InvalidRequestError naming the field when `value` is outside its gt / ge / le bounds."""
    gt, ge, le = (f.metadata.get(k) for k in ("gt", "ge", "le"))
    if value is None:
        return
    if gt is not None and not value > gt:
        raise InvalidRequestError(f.name, f"must be > {gt}, got {value}")
    if (ge is not None and value < ge) or (le is not None and value > le):
        if le is None:
            raise InvalidRequestError(f.name, f"must be >= {ge}, got {value}")
        if ge is None:
            raise InvalidRequestError(f.name, f"must be <= {le}, got {value}")
        raise InvalidRequestError(f.name, f"must be in [{ge}, {le}], got {value}")
