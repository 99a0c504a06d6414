from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Empty(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ShardSpec(_message.Message):
    __slots__ = ("model", "dtype", "device", "num_slots", "max_model_len", "row_budget", "drafter", "draft_model", "num_speculative_tokens", "dflash_checkpoint", "cuda_graphs", "dflash_cuda_graphs", "dflash_dtype", "block_size", "kv_cache_memory_gb", "gpu_memory_utilization", "quantization")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    NUM_SLOTS_FIELD_NUMBER: _ClassVar[int]
    MAX_MODEL_LEN_FIELD_NUMBER: _ClassVar[int]
    ROW_BUDGET_FIELD_NUMBER: _ClassVar[int]
    DRAFTER_FIELD_NUMBER: _ClassVar[int]
    DRAFT_MODEL_FIELD_NUMBER: _ClassVar[int]
    NUM_SPECULATIVE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    DFLASH_CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    CUDA_GRAPHS_FIELD_NUMBER: _ClassVar[int]
    DFLASH_CUDA_GRAPHS_FIELD_NUMBER: _ClassVar[int]
    DFLASH_DTYPE_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    KV_CACHE_MEMORY_GB_FIELD_NUMBER: _ClassVar[int]
    GPU_MEMORY_UTILIZATION_FIELD_NUMBER: _ClassVar[int]
    QUANTIZATION_FIELD_NUMBER: _ClassVar[int]
    model: str
    dtype: str
    device: str
    num_slots: int
    max_model_len: int
    row_budget: int
    drafter: str
    draft_model: str
    num_speculative_tokens: int
    dflash_checkpoint: str
    cuda_graphs: bool
    dflash_cuda_graphs: bool
    dflash_dtype: str
    block_size: int
    kv_cache_memory_gb: float
    gpu_memory_utilization: float
    quantization: str
    def __init__(self, model: _Optional[str] = ..., dtype: _Optional[str] = ..., device: _Optional[str] = ..., num_slots: _Optional[int] = ..., max_model_len: _Optional[int] = ..., row_budget: _Optional[int] = ..., drafter: _Optional[str] = ..., draft_model: _Optional[str] = ..., num_speculative_tokens: _Optional[int] = ..., dflash_checkpoint: _Optional[str] = ..., cuda_graphs: _Optional[bool] = ..., dflash_cuda_graphs: _Optional[bool] = ..., dflash_dtype: _Optional[str] = ..., block_size: _Optional[int] = ..., kv_cache_memory_gb: _Optional[float] = ..., gpu_memory_utilization: _Optional[float] = ..., quantization: _Optional[str] = ...) -> None: ...

class InitRequest(_message.Message):
    __slots__ = ("spec", "rank", "world_size", "collective_address", "collective_timeout_s", "backend")
    SPEC_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    COLLECTIVE_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    COLLECTIVE_TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    spec: ShardSpec
    rank: int
    world_size: int
    collective_address: str
    collective_timeout_s: float
    backend: str
    def __init__(self, spec: _Optional[_Union[ShardSpec, _Mapping]] = ..., rank: _Optional[int] = ..., world_size: _Optional[int] = ..., collective_address: _Optional[str] = ..., collective_timeout_s: _Optional[float] = ..., backend: _Optional[str] = ...) -> None: ...

class ShardLimits(_message.Message):
    __slots__ = ("num_slots", "max_model_len", "row_budget", "vocab_size", "world_size", "drafter", "propose_batch_max", "num_blocks", "block_size", "graphed")
    NUM_SLOTS_FIELD_NUMBER: _ClassVar[int]
    MAX_MODEL_LEN_FIELD_NUMBER: _ClassVar[int]
    ROW_BUDGET_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    DRAFTER_FIELD_NUMBER: _ClassVar[int]
    PROPOSE_BATCH_MAX_FIELD_NUMBER: _ClassVar[int]
    NUM_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    GRAPHED_FIELD_NUMBER: _ClassVar[int]
    num_slots: int
    max_model_len: int
    row_budget: int
    vocab_size: int
    world_size: int
    drafter: str
    propose_batch_max: int
    num_blocks: int
    block_size: int
    graphed: bool
    def __init__(self, num_slots: _Optional[int] = ..., max_model_len: _Optional[int] = ..., row_budget: _Optional[int] = ..., vocab_size: _Optional[int] = ..., world_size: _Optional[int] = ..., drafter: _Optional[str] = ..., propose_batch_max: _Optional[int] = ..., num_blocks: _Optional[int] = ..., block_size: _Optional[int] = ..., graphed: _Optional[bool] = ...) -> None: ...

class DrafterInfo(_message.Message):
    __slots__ = ("kind", "source", "max_drafts")
    KIND_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    MAX_DRAFTS_FIELD_NUMBER: _ClassVar[int]
    kind: str
    source: str
    max_drafts: int
    def __init__(self, kind: _Optional[str] = ..., source: _Optional[str] = ..., max_drafts: _Optional[int] = ...) -> None: ...

class InitReply(_message.Message):
    __slots__ = ("limits", "drafter")
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    DRAFTER_FIELD_NUMBER: _ClassVar[int]
    limits: ShardLimits
    drafter: DrafterInfo
    def __init__(self, limits: _Optional[_Union[ShardLimits, _Mapping]] = ..., drafter: _Optional[_Union[DrafterInfo, _Mapping]] = ...) -> None: ...

class CollectivePortReply(_message.Message):
    __slots__ = ("port",)
    PORT_FIELD_NUMBER: _ClassVar[int]
    port: int
    def __init__(self, port: _Optional[int] = ...) -> None: ...

class SamplingSpec(_message.Message):
    __slots__ = ("temperature", "top_p", "top_k", "seed", "min_p", "rules", "logprobs")
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    MIN_P_FIELD_NUMBER: _ClassVar[int]
    RULES_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    temperature: float
    top_p: float
    top_k: int
    seed: int
    min_p: float
    rules: LogitRules
    logprobs: int
    def __init__(self, temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., top_k: _Optional[int] = ..., seed: _Optional[int] = ..., min_p: _Optional[float] = ..., rules: _Optional[_Union[LogitRules, _Mapping]] = ..., logprobs: _Optional[int] = ...) -> None: ...

class LogitRules(_message.Message):
    __slots__ = ("prompt_len", "presence_penalty", "frequency_penalty", "repetition_penalty", "bias_ids", "bias_values", "min_tokens", "min_tokens_ids")
    PROMPT_LEN_FIELD_NUMBER: _ClassVar[int]
    PRESENCE_PENALTY_FIELD_NUMBER: _ClassVar[int]
    FREQUENCY_PENALTY_FIELD_NUMBER: _ClassVar[int]
    REPETITION_PENALTY_FIELD_NUMBER: _ClassVar[int]
    BIAS_IDS_FIELD_NUMBER: _ClassVar[int]
    BIAS_VALUES_FIELD_NUMBER: _ClassVar[int]
    MIN_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MIN_TOKENS_IDS_FIELD_NUMBER: _ClassVar[int]
    prompt_len: int
    presence_penalty: float
    frequency_penalty: float
    repetition_penalty: float
    bias_ids: _containers.RepeatedScalarFieldContainer[int]
    bias_values: _containers.RepeatedScalarFieldContainer[float]
    min_tokens: int
    min_tokens_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, prompt_len: _Optional[int] = ..., presence_penalty: _Optional[float] = ..., frequency_penalty: _Optional[float] = ..., repetition_penalty: _Optional[float] = ..., bias_ids: _Optional[_Iterable[int]] = ..., bias_values: _Optional[_Iterable[float]] = ..., min_tokens: _Optional[int] = ..., min_tokens_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class PrefillItem(_message.Message):
    __slots__ = ("slot", "tokens", "sampling", "blocks", "cached_len", "grammar_mask", "prompt_logprobs", "next_token")
    SLOT_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    CACHED_LEN_FIELD_NUMBER: _ClassVar[int]
    GRAMMAR_MASK_FIELD_NUMBER: _ClassVar[int]
    PROMPT_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    NEXT_TOKEN_FIELD_NUMBER: _ClassVar[int]
    slot: int
    tokens: _containers.RepeatedScalarFieldContainer[int]
    sampling: SamplingSpec
    blocks: _containers.RepeatedScalarFieldContainer[int]
    cached_len: int
    grammar_mask: bytes
    prompt_logprobs: int
    next_token: int
    def __init__(self, slot: _Optional[int] = ..., tokens: _Optional[_Iterable[int]] = ..., sampling: _Optional[_Union[SamplingSpec, _Mapping]] = ..., blocks: _Optional[_Iterable[int]] = ..., cached_len: _Optional[int] = ..., grammar_mask: _Optional[bytes] = ..., prompt_logprobs: _Optional[int] = ..., next_token: _Optional[int] = ...) -> None: ...

class RowLogprobs(_message.Message):
    __slots__ = ("chosen", "top_ids", "top_logprobs", "drafts")
    CHOSEN_FIELD_NUMBER: _ClassVar[int]
    TOP_IDS_FIELD_NUMBER: _ClassVar[int]
    TOP_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    DRAFTS_FIELD_NUMBER: _ClassVar[int]
    chosen: _containers.RepeatedScalarFieldContainer[float]
    top_ids: _containers.RepeatedScalarFieldContainer[int]
    top_logprobs: _containers.RepeatedScalarFieldContainer[float]
    drafts: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, chosen: _Optional[_Iterable[float]] = ..., top_ids: _Optional[_Iterable[int]] = ..., top_logprobs: _Optional[_Iterable[float]] = ..., drafts: _Optional[_Iterable[float]] = ...) -> None: ...

class PrefillRequest(_message.Message):
    __slots__ = ("items",)
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[PrefillItem]
    def __init__(self, items: _Optional[_Iterable[_Union[PrefillItem, _Mapping]]] = ...) -> None: ...

class PrefillResult(_message.Message):
    __slots__ = ("next_tokens", "logprobs", "prompt_logprobs")
    NEXT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    next_tokens: _containers.RepeatedScalarFieldContainer[int]
    logprobs: _containers.RepeatedCompositeFieldContainer[RowLogprobs]
    prompt_logprobs: _containers.RepeatedCompositeFieldContainer[RowLogprobs]
    def __init__(self, next_tokens: _Optional[_Iterable[int]] = ..., logprobs: _Optional[_Iterable[_Union[RowLogprobs, _Mapping]]] = ..., prompt_logprobs: _Optional[_Iterable[_Union[RowLogprobs, _Mapping]]] = ...) -> None: ...

class Command(_message.Message):
    __slots__ = ("timeout_s", "prefill", "verify", "commit", "propose", "release", "before")
    TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    PREFILL_FIELD_NUMBER: _ClassVar[int]
    VERIFY_FIELD_NUMBER: _ClassVar[int]
    COMMIT_FIELD_NUMBER: _ClassVar[int]
    PROPOSE_FIELD_NUMBER: _ClassVar[int]
    RELEASE_FIELD_NUMBER: _ClassVar[int]
    BEFORE_FIELD_NUMBER: _ClassVar[int]
    timeout_s: float
    prefill: PrefillRequest
    verify: VerifyBatch
    commit: Verdict
    propose: ProposeBatch
    release: ReleaseRequest
    before: _containers.RepeatedCompositeFieldContainer[Command]
    def __init__(self, timeout_s: _Optional[float] = ..., prefill: _Optional[_Union[PrefillRequest, _Mapping]] = ..., verify: _Optional[_Union[VerifyBatch, _Mapping]] = ..., commit: _Optional[_Union[Verdict, _Mapping]] = ..., propose: _Optional[_Union[ProposeBatch, _Mapping]] = ..., release: _Optional[_Union[ReleaseRequest, _Mapping]] = ..., before: _Optional[_Iterable[_Union[Command, _Mapping]]] = ...) -> None: ...

class CommandReply(_message.Message):
    __slots__ = ("code", "details", "prefill", "verify", "done", "propose")
    CODE_FIELD_NUMBER: _ClassVar[int]
    DETAILS_FIELD_NUMBER: _ClassVar[int]
    PREFILL_FIELD_NUMBER: _ClassVar[int]
    VERIFY_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    PROPOSE_FIELD_NUMBER: _ClassVar[int]
    code: int
    details: str
    prefill: PrefillResult
    verify: VerifyResult
    done: Empty
    propose: ProposeResult
    def __init__(self, code: _Optional[int] = ..., details: _Optional[str] = ..., prefill: _Optional[_Union[PrefillResult, _Mapping]] = ..., verify: _Optional[_Union[VerifyResult, _Mapping]] = ..., done: _Optional[_Union[Empty, _Mapping]] = ..., propose: _Optional[_Union[ProposeResult, _Mapping]] = ...) -> None: ...

class VerifyBatch(_message.Message):
    __slots__ = ("batch_id", "n", "k", "slots", "start_pos", "tokens", "sampling", "blocks", "block_counts", "grammar_masks", "prefill")
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    N_FIELD_NUMBER: _ClassVar[int]
    K_FIELD_NUMBER: _ClassVar[int]
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    START_POS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    BLOCK_COUNTS_FIELD_NUMBER: _ClassVar[int]
    GRAMMAR_MASKS_FIELD_NUMBER: _ClassVar[int]
    PREFILL_FIELD_NUMBER: _ClassVar[int]
    batch_id: int
    n: int
    k: int
    slots: _containers.RepeatedScalarFieldContainer[int]
    start_pos: _containers.RepeatedScalarFieldContainer[int]
    tokens: _containers.RepeatedScalarFieldContainer[int]
    sampling: _containers.RepeatedCompositeFieldContainer[SamplingSpec]
    blocks: _containers.RepeatedScalarFieldContainer[int]
    block_counts: _containers.RepeatedScalarFieldContainer[int]
    grammar_masks: _containers.RepeatedScalarFieldContainer[bytes]
    prefill: _containers.RepeatedCompositeFieldContainer[PrefillItem]
    def __init__(self, batch_id: _Optional[int] = ..., n: _Optional[int] = ..., k: _Optional[int] = ..., slots: _Optional[_Iterable[int]] = ..., start_pos: _Optional[_Iterable[int]] = ..., tokens: _Optional[_Iterable[int]] = ..., sampling: _Optional[_Iterable[_Union[SamplingSpec, _Mapping]]] = ..., blocks: _Optional[_Iterable[int]] = ..., block_counts: _Optional[_Iterable[int]] = ..., grammar_masks: _Optional[_Iterable[bytes]] = ..., prefill: _Optional[_Iterable[_Union[PrefillItem, _Mapping]]] = ...) -> None: ...

class VerifyResult(_message.Message):
    __slots__ = ("batch_id", "picks", "accept_probs", "logprobs", "prefill")
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    PICKS_FIELD_NUMBER: _ClassVar[int]
    ACCEPT_PROBS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    PREFILL_FIELD_NUMBER: _ClassVar[int]
    batch_id: int
    picks: _containers.RepeatedScalarFieldContainer[int]
    accept_probs: _containers.RepeatedScalarFieldContainer[float]
    logprobs: _containers.RepeatedCompositeFieldContainer[RowLogprobs]
    prefill: PrefillResult
    def __init__(self, batch_id: _Optional[int] = ..., picks: _Optional[_Iterable[int]] = ..., accept_probs: _Optional[_Iterable[float]] = ..., logprobs: _Optional[_Iterable[_Union[RowLogprobs, _Mapping]]] = ..., prefill: _Optional[_Union[PrefillResult, _Mapping]] = ...) -> None: ...

class Verdict(_message.Message):
    __slots__ = ("batch_id", "words")
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    WORDS_FIELD_NUMBER: _ClassVar[int]
    batch_id: int
    words: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, batch_id: _Optional[int] = ..., words: _Optional[_Iterable[int]] = ...) -> None: ...

class ProposeBatch(_message.Message):
    __slots__ = ("slots", "last_tokens", "positions", "num_drafts", "sampling", "grammars")
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    LAST_TOKENS_FIELD_NUMBER: _ClassVar[int]
    POSITIONS_FIELD_NUMBER: _ClassVar[int]
    NUM_DRAFTS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    GRAMMARS_FIELD_NUMBER: _ClassVar[int]
    slots: _containers.RepeatedScalarFieldContainer[int]
    last_tokens: _containers.RepeatedScalarFieldContainer[int]
    positions: _containers.RepeatedScalarFieldContainer[int]
    num_drafts: _containers.RepeatedScalarFieldContainer[int]
    sampling: _containers.RepeatedCompositeFieldContainer[SamplingSpec]
    grammars: _containers.RepeatedCompositeFieldContainer[DraftGrammar]
    def __init__(self, slots: _Optional[_Iterable[int]] = ..., last_tokens: _Optional[_Iterable[int]] = ..., positions: _Optional[_Iterable[int]] = ..., num_drafts: _Optional[_Iterable[int]] = ..., sampling: _Optional[_Iterable[_Union[SamplingSpec, _Mapping]]] = ..., grammars: _Optional[_Iterable[_Union[DraftGrammar, _Mapping]]] = ...) -> None: ...

class DraftGrammar(_message.Message):
    __slots__ = ("kind", "value", "start")
    KIND_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    kind: str
    value: str
    start: int
    def __init__(self, kind: _Optional[str] = ..., value: _Optional[str] = ..., start: _Optional[int] = ...) -> None: ...

class ProposeResult(_message.Message):
    __slots__ = ("tokens", "counts")
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    COUNTS_FIELD_NUMBER: _ClassVar[int]
    tokens: _containers.RepeatedScalarFieldContainer[int]
    counts: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, tokens: _Optional[_Iterable[int]] = ..., counts: _Optional[_Iterable[int]] = ...) -> None: ...

class ReleaseRequest(_message.Message):
    __slots__ = ("slots",)
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    slots: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, slots: _Optional[_Iterable[int]] = ...) -> None: ...

class HealthReply(_message.Message):
    __slots__ = ("ready", "rank", "world_size", "pid", "busy", "pending_batch_id", "last_verdict_batch_id", "last_verdict_failed", "verdicts", "failed_verdicts", "session_socket", "session_token")
    READY_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    BUSY_FIELD_NUMBER: _ClassVar[int]
    PENDING_BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    LAST_VERDICT_BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    LAST_VERDICT_FAILED_FIELD_NUMBER: _ClassVar[int]
    VERDICTS_FIELD_NUMBER: _ClassVar[int]
    FAILED_VERDICTS_FIELD_NUMBER: _ClassVar[int]
    SESSION_SOCKET_FIELD_NUMBER: _ClassVar[int]
    SESSION_TOKEN_FIELD_NUMBER: _ClassVar[int]
    ready: bool
    rank: int
    world_size: int
    pid: int
    busy: bool
    pending_batch_id: int
    last_verdict_batch_id: int
    last_verdict_failed: bool
    verdicts: int
    failed_verdicts: int
    session_socket: str
    session_token: bytes
    def __init__(self, ready: _Optional[bool] = ..., rank: _Optional[int] = ..., world_size: _Optional[int] = ..., pid: _Optional[int] = ..., busy: _Optional[bool] = ..., pending_batch_id: _Optional[int] = ..., last_verdict_batch_id: _Optional[int] = ..., last_verdict_failed: _Optional[bool] = ..., verdicts: _Optional[int] = ..., failed_verdicts: _Optional[int] = ..., session_socket: _Optional[str] = ..., session_token: _Optional[bytes] = ...) -> None: ...

class FaultRequest(_message.Message):
    __slots__ = ("mode",)
    class Mode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        NONE: _ClassVar[FaultRequest.Mode]
        RAISE: _ClassVar[FaultRequest.Mode]
        HANG: _ClassVar[FaultRequest.Mode]
        EXIT: _ClassVar[FaultRequest.Mode]
        SHORT_RESULT: _ClassVar[FaultRequest.Mode]
    NONE: FaultRequest.Mode
    RAISE: FaultRequest.Mode
    HANG: FaultRequest.Mode
    EXIT: FaultRequest.Mode
    SHORT_RESULT: FaultRequest.Mode
    MODE_FIELD_NUMBER: _ClassVar[int]
    mode: FaultRequest.Mode
    def __init__(self, mode: _Optional[_Union[FaultRequest.Mode, str]] = ...) -> None: ...
