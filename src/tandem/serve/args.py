"""The builder's arguments: what a Serve config or `tandem serve` may set."""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from tandem.drafters.factory import resolve_dflash_checkpoint
from tandem.errors import InvalidRequestError


class TandemServeArgs(BaseModel):
    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    model: str | None = Field(None, description="Target model: a known name (smollm2, qwen2.5-coder-0.5b, qwen2.5-coder-1.5b), a local folder, a .gguf file, or a hub name. None = SmolLM2-135M-Instruct.")
    served_model_name: str | None = Field(None, description="The model id clients send and /v1/models lists; defaults to the model's name.")
    drafter: Literal["none", "ngram", "draft-model", "dflash"] = Field("ngram", description="Who proposes drafts: none, n-gram prompt lookup, a draft model, or DFlash.")
    draft_model: str | None = Field(None, description="The draft model for drafter=draft-model; must share the target's tokenizer.")
    dflash_checkpoint: str | None = Field(None, description="For drafter=dflash: a DFlash checkpoint folder (config.json + *.safetensors) on the shard nodes; None = the weights shipped for the model.")
    num_speculative_tokens: int | None = Field(None, ge=0, le=16, description="Most drafts per sequence per verify round; None = block_size - 1 of the DFlash checkpoint for drafter=dflash, else 4.")
    tensor_parallel_size: int = Field(1, ge=1, le=64, description="Shard ranks the target is split over (one shard actor each, one GPU each where there are GPUs).")
    max_num_seqs: int = Field(32, ge=1, le=4096, description="Sequences running at once (KV slots per rank).")
    max_seq_len: int = Field(1024, ge=16, le=131072, description="Context length per sequence (prompt + output).")
    row_budget: int = Field(256, ge=2, le=65536, description="Most rows one target forward takes (n sequences x k rows).")
    max_tokens_limit: int = Field(1024, ge=1, description="Largest max_tokens a request may ask for.")
    max_body_bytes: int = Field(8 << 20, ge=1024, le=1 << 30, description="Largest request body in bytes; a larger one is answered 413 (from its Content-Length, before it is read). 8 MiB holds a long context many times over, as text or token ids.")
    max_prompt_chars: int | None = Field(None, ge=1, description="Longest prompt text in characters (a completion's prompt, or a chat's message contents together), refused with a 400 before it reaches the tokenizer, which runs on the engine's step thread (1 MB of text stalls every running stream ~1.4 s on a CPU core). None = 32 x max_seq_len: no longer text fits the context (real text runs ~4 characters a token). The exact cap on prompt tokens is max_seq_len.")
    max_stop_strings: int = Field(4, ge=0, le=64, description="Most stop strings a request may give (OpenAI's limit is 4).")
    max_stop_chars: int = Field(256, ge=1, le=65536, description="Longest stop string in characters: every stream holds back that much text while it might be a stop string's start.")
    max_waiting_requests: int = Field(128, ge=0, description="Requests each ingress replica holds beyond the engine's max_num_seqs slots, waiting for one; past that a request is answered 429 with Retry-After. 128 (4 x the default max_num_seqs): one at the back of that queue waits about four requests' time, beyond which coming back later serves a client better than a queue it would time out in.")
    device: str = Field("auto", description="Shard device: auto (a GPU when the actor has one), cpu, cuda.")
    dtype: str = Field("auto", description="Weights dtype: auto (bf16 on GPU, float32 on CPU), float32, bfloat16.")
    api_key: str | None = Field(None, description="When set, requests must carry 'Authorization: Bearer <api_key>'.")
    rpc_deadline_s: float = Field(30.0, gt=0, description="Deadline of each shard RPC; a hung rank fails its batch after this.")
    shard_num_gpus: float = Field(0.0, ge=0, description="GPUs per shard actor (1 on a GPU cluster, 0 on CPU).")
    shard_num_cpus: float = Field(0.5, ge=0, description="CPUs reserved per shard actor.")
    shard_torch_threads: int | None = Field(None, ge=1, description="Torch threads per CPU shard actor; None = the node's cores divided by tensor_parallel_size.")
    scheduler_num_cpus: float = Field(0.25, ge=0, description="CPUs reserved by the scheduler actor (it runs the step loop, n-gram drafting and detokenization).")
    max_ongoing_requests: int = Field(1024, ge=1, description="Requests each ingress replica takes at once (Serve's max_ongoing_requests); more wait in the proxy.")
    ingress_replicas: int = Field(1, ge=1, le=64, description="HTTP ingress replicas in front of the one engine, each a process of its own that parses its share of the requests and writes its share of the streams. More than 1 needs Serve's HAProxy mode in the cluster (RAY_SERVE_ENABLE_HA_PROXY=1 where Ray starts; `tandem serve --ingress-replicas N` sets it up) to put them behind one port.")
    in_process_target: bool = Field(False, description="Run the single rank inside the scheduler actor, which then reserves shard_num_gpus: no gRPC hop a verify, so less latency at few clients; but a rank that fails takes the engine and every running request with it, where a shard actor is restarted and its sequences go on. Only with tensor_parallel_size 1.")
    session_socket: bool = Field(True, description="Send the tick's commands to shard ranks on the scheduler's node over each rank's Unix socket: the same protobuf messages as the gRPC Session stream, without gRPC's thread hand-offs (a round trip of ~0.1 ms instead of ~0.6 on an H200 host). False: gRPC always. Ranks on other nodes use gRPC either way.")
    session_spin_us: int | None = Field(None, ge=0, le=1_000_000, description="How long the scheduler and each shard rank busy-poll their session socket for the next message before they block, in microseconds: 0.1-0.2 ms off every tick on an H200 host (verify_legs), for a core each kept busy while requests run. None: 20000 where a process may use 8 cores or more (its CPU affinity, within its container's CPU quota), else 0 (no polling).")
    engine_actor_name: str | None = Field(None, description="Name the scheduler actor (Ray namespace 'tandem') so other Ray programs can use the served engine through tandem.actors.connect(name).")

    @field_validator("dflash_checkpoint")
    @classmethod
    def _absolute_checkpoint(cls, value: str | None) -> str | None:
        # checked here, and made absolute: the shard actors do not run in this cwd
        if value is None:
            return None
        try:
            return resolve_dflash_checkpoint(None, value)[0]
        except InvalidRequestError as e:
            raise ValueError(e.message) from None

    @model_validator(mode="after")
    def _check_in_process_target(self) -> "TandemServeArgs":
        if self.in_process_target and self.tensor_parallel_size != 1:
            raise ValueError(f"in_process_target: holds one rank, not tensor_parallel_size {self.tensor_parallel_size}")
        return self

    @model_validator(mode="after")
    def _check_dflash(self) -> "TandemServeArgs":
        if self.dflash_checkpoint is not None and self.drafter != "dflash":
            raise ValueError(f"dflash_checkpoint: is for drafter=dflash, not {self.drafter!r}")
        if self.drafter == "dflash":
            try:
                _, block_size = resolve_dflash_checkpoint(self.model, self.dflash_checkpoint)
            except InvalidRequestError as e:
                raise ValueError(str(e)) from None
            gamma = self.num_speculative_tokens
            if gamma is not None and gamma > block_size - 1:
                raise ValueError(f"num_speculative_tokens: the DFlash checkpoint drafts at most block_size - 1 = "
                                 f"{block_size - 1} tokens, got {gamma}")
        return self
