"""The builder's arguments: what a Serve config or `tandem serve` may set."""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class TandemServeArgs(BaseModel):
    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    model: str | None = Field(None, description="Target model: a known name (smollm2, qwen2.5-coder-0.5b, qwen2.5-coder-1.5b), a local folder, a .gguf file, or a hub name. None = SmolLM2-135M-Instruct.")
    served_model_name: str | None = Field(None, description="The model id clients send and /v1/models lists; defaults to the model's name.")
    drafter: Literal["none", "ngram", "draft-model", "dflash"] = Field("ngram", description="Who proposes drafts: none, n-gram prompt lookup, a draft model, or DFlash.")
    draft_model: str | None = Field(None, description="The draft model for drafter=draft-model; must share the target's tokenizer.")
    num_speculative_tokens: int = Field(4, ge=0, le=16, description="Most drafts per sequence per verify round.")
    tensor_parallel_size: int = Field(1, ge=1, le=64, description="Shard ranks the target is split over (one shard actor each, one GPU each where there are GPUs).")
    max_num_seqs: int = Field(32, ge=1, le=4096, description="Sequences running at once (KV slots per rank).")
    max_seq_len: int = Field(1024, ge=16, le=131072, description="Context length per sequence (prompt + output).")
    row_budget: int = Field(256, ge=2, le=65536, description="Most rows one target forward takes (n sequences x k rows).")
    max_tokens_limit: int = Field(1024, ge=1, description="Largest max_tokens a request may ask for.")
    device: str = Field("auto", description="Shard device: auto (a GPU when the actor has one), cpu, cuda.")
    dtype: str = Field("auto", description="Weights dtype: auto (bf16 on GPU, float32 on CPU), float32, bfloat16.")
    api_key: str | None = Field(None, description="When set, requests must carry 'Authorization: Bearer <api_key>'.")
    rpc_deadline_s: float = Field(30.0, gt=0, description="Deadline of each shard RPC; a hung rank fails its batch after this.")
    shard_num_gpus: float = Field(0.0, ge=0, description="GPUs per shard actor (1 on a GPU cluster, 0 on CPU).")
    shard_num_cpus: float = Field(0.5, ge=0, description="CPUs reserved per shard actor.")
    shard_torch_threads: int | None = Field(None, ge=1, description="Torch threads per CPU shard actor; None = the node's cores divided by tensor_parallel_size.")
    scheduler_num_cpus: float = Field(0.25, ge=0, description="CPUs reserved by the scheduler actor (it runs the step loop, n-gram drafting and detokenization).")
    max_ongoing_requests: int = Field(1024, ge=1, description="Requests the ingress replica takes at once (Serve's max_ongoing_requests); more wait in the proxy.")
    in_process_target: bool = Field(False, description="Keep the single rank inside the scheduler actor (no shard actors, no gRPC, no shard restarts); only with tensor_parallel_size 1.")
    engine_actor_name: str | None = Field(None, description="Name the scheduler actor (Ray namespace 'tandem') so other Ray programs can use the served engine through tandem.actors.connect(name).")
