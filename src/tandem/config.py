"""EngineConfig: how an engine is built, checked when built."""
from __future__ import annotations

from dataclasses import dataclass

from tandem.drafters.factory import RANK_DRAFTERS, check_drafter_name
from tandem.errors import InvalidRequestError

DEFAULT_NUM_SPECULATIVE_TOKENS = 4  # when the drafter has no block size of its own
MAX_NUM_SPECULATIVE_TOKENS = 16


class _DefaultGamma(int):
    """A num_speculative_tokens the config chose, not the user: dataclasses.replace(config,
    drafter=...) passes it on, and __post_init__ then chooses again for the new drafter."""


@dataclass(frozen=True)
class EngineConfig:
    model: str | None = None  # None = the default model (SmolLM2-135M-Instruct)
    drafter: str = "ngram"  # none | ngram | draft-model | dflash
    draft_model: str | None = None  # for drafter="draft-model"
    dflash_checkpoint: str | None = None  # for drafter="dflash": a checkpoint folder; None = the shipped weights
    # the most drafts a sequence gets per round; None = block_size - 1 of the DFlash
    # checkpoint for drafter="dflash", else DEFAULT_NUM_SPECULATIVE_TOKENS
    num_speculative_tokens: int | None = None
    adaptive: bool = True  # adapt gamma per sequence and cap it per batch
    max_num_seqs: int = 32  # KV slots = sequences running at once
    max_seq_len: int = 1024  # context per slot (prompt + output)
    row_budget: int = 256  # most rows in one target forward
    shards: int = 1  # target ranks: 1 = in process, N > 1 = N gRPC shard processes
    device: str = "auto"
    dtype: str = "auto"
    max_verify_failures: int = 3
    ngram_max: int = 4
    ngram_min: int = 1

    def __post_init__(self) -> None:
        check_drafter_name(self.drafter)
        if self.drafter == "draft-model" and not self.draft_model:
            raise InvalidRequestError("draft_model", "drafter 'draft-model' needs a draft model")
        for name in ("max_num_seqs", "max_seq_len", "row_budget", "shards", "max_verify_failures"):
            if getattr(self, name) < 1:
                raise InvalidRequestError(name, f"must be >= 1, got {getattr(self, name)}")
        self._resolve_speculative_tokens()
        if not 0 <= self.num_speculative_tokens <= MAX_NUM_SPECULATIVE_TOKENS:
            raise InvalidRequestError("num_speculative_tokens",
                                      f"must be in [0, {MAX_NUM_SPECULATIVE_TOKENS}], got {self.num_speculative_tokens}")
        if self.row_budget < self.num_speculative_tokens + 1:
            raise InvalidRequestError("row_budget", "must fit one sequence's rows (num_speculative_tokens + 1)")

    def _resolve_speculative_tokens(self) -> None:
        gamma = self.num_speculative_tokens
        chosen = gamma is None or isinstance(gamma, _DefaultGamma)
        if self.drafter != "dflash":
            if chosen:
                object.__setattr__(self, "num_speculative_tokens", _DefaultGamma(DEFAULT_NUM_SPECULATIVE_TOKENS))
            return
        from tandem.drafters.factory import resolve_dflash_checkpoint

        # an absolute folder: shard processes (Ray actors included) may run in another cwd
        folder, block_size = resolve_dflash_checkpoint(self.model, self.dflash_checkpoint)
        if self.dflash_checkpoint is not None:
            object.__setattr__(self, "dflash_checkpoint", folder)
        most = block_size - 1  # one block = the last token + block_size - 1 drafts
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
        return self.drafter if self.drafter in RANK_DRAFTERS else "none"

    def shard_spec(self):
        from tandem.shard.factory import ShardSpec

        return ShardSpec(
            model=self.model,
            dtype=self.dtype,
            device=self.device,
            num_slots=self.max_num_seqs,
            max_seq_len=self.max_seq_len,
            row_budget=self.row_budget,
            drafter=self.rank_drafter,
            draft_model=self.draft_model,
            dflash_checkpoint=self.dflash_checkpoint if self.drafter == "dflash" else None,
            num_speculative_tokens=int(self.num_speculative_tokens),
        )
