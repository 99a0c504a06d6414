"""The commands the scheduler sends to shard ranks, and their results.

These plain dataclasses are the shard control protocol in Python: LocalShardGroup
hands them to an in-process ModelShard, and the gRPC codec maps them one-to-one
onto protos/shard.proto messages.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from tandem.errors import ShapeError


@dataclass(frozen=True)
class LogitRules:
    """Penalties and biases a rank applies to a sequence's logits before its pick
    (tandem.sampling.logit_processors). The counts they need come from the rank's own
    history of the slot: only the prompt's length travels, so this is constant per
    sequence and costs the wire nothing a tick beyond itself."""

    prompt_len: int  # history[:prompt_len] is the prompt, the rest its output
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias)
    min_tokens: int = 0
    min_tokens_ids: tuple[int, ...] = ()  # EOS and stop_token_ids: masked while fewer than min_tokens are out


@dataclass(frozen=True)
class SamplingSpec:
    """What a rank needs to pick tokens for one sequence."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int = 0
    min_p: float = 0.0
    rules: LogitRules | None = None  # None: the logits as the model gives them
    logprobs: int | None = None  # the picked rows' log-probabilities and their top N (tandem.sampling.logprobs); None = none

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


GREEDY = SamplingSpec()


@dataclass(frozen=True)
class PrefillItem:
    slot: int
    tokens: list[int]  # the whole known history of the sequence (prompt, plus output on a re-prefill)
    sampling: SamplingSpec = GREEDY
    blocks: list[int] = field(default_factory=list)  # its block table, covering every token (tandem.kv.KVBlockManager)
    cached_len: int = 0  # leading tokens whose KV the blocks already hold (a prefix-cache hit)
    grammar_mask: bytes = b""  # the pick's allowed tokens (tandem.sampling.grammar_mask); b"" = any
    # score the prompt: the log-probability of every token after cached_len (and of
    # next_token, the one after the item, when >= 0) with the top N of its row; None = none
    prompt_logprobs: int | None = None
    next_token: int = -1


@dataclass(frozen=True)
class RowLogprobs:
    """The model's own (raw) log-probabilities at some rows of one sequence: chosen[r] is
    the row's token's (its pick, or the given token), top_ids / top_logprobs the N most
    likely of each row (r-major), drafts[r] the draft's that row checked (verify only)."""

    chosen: list[float] = field(default_factory=list)
    top_ids: list[int] = field(default_factory=list)
    top_logprobs: list[float] = field(default_factory=list)
    drafts: list[float] = field(default_factory=list)

    def top(self, row: int) -> tuple[tuple[int, float], ...]:
        """Row `row`'s top N as (token id, logprob), most likely first."""
        n = len(self.top_ids) // max(1, len(self.chosen))
        at = row * n
        return tuple(zip(self.top_ids[at : at + n], self.top_logprobs[at : at + n]))


NO_LOGPROBS = RowLogprobs()


@dataclass(frozen=True)
class PrefillResult:
    next_tokens: list[int]  # [n] the pick after each item's last token
    # [n] or empty (none asked): the pick's RowLogprobs (one row) of items whose sampling asks
    logprobs: list[RowLogprobs] = field(default_factory=list)
    # [n] or empty: the scored prompt rows of items with prompt_logprobs (see PrefillItem)
    prompt_logprobs: list[RowLogprobs] = field(default_factory=list)


@dataclass(frozen=True)
class VerifyBatch:
    """One batched target forward of n sequences x k rows.

    Row 0 of sequence i is its last emitted token (whose KV is not written yet),
    rows 1..k-1 are its drafts. Row r sits at position start_pos[i] + r.
    """

    batch_id: int
    n: int
    k: int
    slots: list[int]  # [n]
    start_pos: list[int]  # [n] the committed KV length of each slot
    tokens: list[int]  # [n*k] sequence-major
    sampling: list[SamplingSpec]  # [n]
    block_tables: list[list[int]] = field(default_factory=list)  # [n] each sequence's blocks, covering start_pos + k positions
    # [n] or empty (none constrained): sequence i's k rows of allowed tokens
    # (tandem.sampling.grammar_mask); b"" = unconstrained
    grammar_masks: list[bytes] = field(default_factory=list)
    # prompt chunks riding on the verify: prefilled in the same forward (slots apart from the
    # batch's, no prompt scoring), done whatever the verdict; [] = none
    prefill: list[PrefillItem] = field(default_factory=list)


@dataclass(frozen=True)
class VerifyResult:
    """Rank 0's answer: for every row, the target's pick and the chance to accept the draft.

    picks[i*k + j]: greedy: the argmax of row j. Sampled: for j < k-1 the token to
    emit if draft j is rejected (a draw from the normalised max(0, p - q)); for the
    last row a draw from p (the bonus token).
    accept_probs[i*k + j] (j < k-1): min(1, p(d_j) / q(d_j)); greedy: 1.0 if the
    draft equals the argmax else 0.0. The last row's entry is unused (0).
    """

    batch_id: int
    picks: list[int]  # [n*k]
    accept_probs: list[float]  # [n*k]
    # [n] or empty (none asked): k rows of each sequence whose sampling asks for logprobs
    logprobs: list[RowLogprobs] = field(default_factory=list)
    prefill: PrefillResult | None = None  # the riding chunks' result, when the batch carried any


@dataclass(frozen=True)
class Verdict:
    """words[i] = accepted_i + 1 rows of sequence i to commit; all zeros = failed, commit nothing."""

    batch_id: int
    words: list[int]  # [n]

    @property
    def failed(self) -> bool:
        return all(w == 0 for w in self.words)


def failed_verdict(batch_id: int, n: int) -> Verdict:
    """The verdict that tells every rank to drop the batch's rows."""
    return Verdict(batch_id=batch_id, words=[0] * n)


@dataclass(frozen=True)
class DraftGrammar:
    """A constrained sequence's grammar, for a rank-side drafter to draft under
    (tandem.grammar.draft_matchers): the constraint's kind and value (as GrammarConstraint
    has them) and the position of the output's first token, from which the grammar has
    consumed every token of the slot's history. The rank keeps a matcher of its own a slot
    and advances it by the committed tokens: only this travels, the same every propose."""

    kind: str
    value: str
    start: int


@dataclass(frozen=True)
class ProposeBatch:
    """Ask the rank-side drafter for up to `num_drafts` drafts for each slot.

    last_tokens[i] is sequence i's last emitted token, at position positions[i]
    (= its committed KV length); the drafter already knows everything before it.
    grammars[i]: sequence i's grammar, None for a free one; [] = none constrained.
    """

    slots: list[int]
    last_tokens: list[int]
    positions: list[int]
    num_drafts: list[int]
    sampling: list[SamplingSpec]
    grammars: list[DraftGrammar | None] = field(default_factory=list)


@dataclass(frozen=True)
class ProposeResult:
    drafts: list[list[int]]  # [n][<= num_drafts[i]]


@dataclass(frozen=True)
class ShardLimits:
    """What a shard group can take, told to the scheduler once at start."""

    num_slots: int  # sequences at once
    max_model_len: int  # positions of one sequence
    row_budget: int  # max n*k rows of one forward
    vocab_size: int
    world_size: int = 1
    drafter: str = "none"  # the rank-side drafter's kind, "none" when the scheduler drafts
    propose_batch_max: int = 64
    num_blocks: int = 1  # the KV pool of every rank, in blocks of block_size positions
    block_size: int = 16
    graphed: bool = False  # its forwards replay CUDA graphs; one with prompt chunks riding runs eagerly

    @property
    def max_blocks(self) -> int:
        """The most blocks one sequence's table holds."""
        return -(-self.max_model_len // self.block_size)


@dataclass
class ShapeRules:
    """The verify-batch shape rules, checked before anything is sent."""

    num_slots: int
    row_budget: int
    num_blocks: int = 1
    block_size: int = 16
    max_blocks: int = 1

    @classmethod
    def of(cls, limits: "ShardLimits") -> "ShapeRules":
        return cls(num_slots=limits.num_slots, row_budget=limits.row_budget, num_blocks=limits.num_blocks,
                   block_size=limits.block_size, max_blocks=limits.max_blocks)

    def check(self, cmd: VerifyBatch) -> None:
        if cmd.n < 1:
            raise ShapeError("n>=1", f"n={cmd.n}: a verify batch needs at least one sequence")
        if cmd.k < 1:
            raise ShapeError("k>=1", f"k={cmd.k}: a verify batch needs at least one row per sequence")
        if cmd.n * cmd.k > self.row_budget:
            raise ShapeError("row_budget", f"n*k={cmd.n * cmd.k} exceeds the row budget {self.row_budget}")
        if len(cmd.tokens) != cmd.n * cmd.k:
            raise ShapeError("len(tokens)==n*k", f"{len(cmd.tokens)} tokens for n={cmd.n}, k={cmd.k}")
        if len(cmd.slots) != cmd.n:
            raise ShapeError("len(slots)==n", f"{len(cmd.slots)} slots for n={cmd.n}")
        if len(cmd.start_pos) != cmd.n or len(cmd.sampling) != cmd.n:
            raise ShapeError("len(start_pos)==len(sampling)==n", f"n={cmd.n}")
        if cmd.grammar_masks and len(cmd.grammar_masks) != cmd.n:
            raise ShapeError("len(grammar_masks) in (0, n)", f"{len(cmd.grammar_masks)} grammar masks for n={cmd.n}")
        if len(set(cmd.slots)) != cmd.n:
            raise ShapeError("slots distinct", f"slots {cmd.slots} repeat a slot")
        bad = [s for s in cmd.slots if not 0 <= s < self.num_slots]
        if bad:
            raise ShapeError("slots in range", f"slots {bad} outside [0, {self.num_slots})")
        if len(cmd.block_tables) != cmd.n:
            raise ShapeError("len(block_tables)==n", f"{len(cmd.block_tables)} block tables for n={cmd.n}")
        for slot, start, table in zip(cmd.slots, cmd.start_pos, cmd.block_tables):
            self.check_table(slot, table, start + cmd.k)
        bs = self.block_size
        written = [t[p // bs : -(-(p + cmd.k) // bs)] for p, t in zip(cmd.start_pos, cmd.block_tables)]
        if cmd.prefill:
            self._check_riders(cmd, written)
        else:
            self.check_writes(cmd.slots, cmd.block_tables, written, "batch")

    def _check_riders(self, cmd: VerifyBatch, written: list[list[int]]) -> None:
        """Prompt chunks riding on a verify (each checked as a prefill item by the rank):
        slots apart from the batch's, no prompt scoring, their rows within the row budget,
        and no block written by two sequences of the forward."""
        riders = cmd.prefill
        shared = set(cmd.slots) & {it.slot for it in riders}
        if shared:
            raise ShapeError("prefill slots apart", f"slots {sorted(shared)} are verified and prefilled in one batch")
        if any(it.prompt_logprobs is not None for it in riders):
            raise ShapeError("prefill prompt_logprobs", "a chunk that scores its prompt does not ride on a verify")
        rows = sum(len(it.tokens) - it.cached_len for it in riders)
        if rows > self.row_budget:
            raise ShapeError("row_budget", f"the riding chunks' {rows} rows exceed the row budget {self.row_budget}")
        bs = self.block_size
        slots = list(cmd.slots) + [it.slot for it in riders]
        tables = list(cmd.block_tables) + [list(it.blocks) for it in riders]
        written = written + [list(it.blocks[it.cached_len // bs :]) for it in riders]
        self.check_writes(slots, tables, written, "verify with its chunks")

    def check_writes(self, slots: list[int], tables: list[list[int]], written: list[list[int]], what: str) -> None:
        """A block one sequence writes (written[i], part of tables[i]) lies in no other
        sequence's table: only full, committed blocks are shared, and nobody writes those."""
        every: set[int] = set()
        for slot, own in zip(slots, written):
            if not every.isdisjoint(own):  # two sequences write one block
                raise ShapeError("blocks written", f"slot {slot}: this {what} writes a block of its table for another sequence")
            every.update(own)
        for slot, table, own in zip(slots, tables, written):
            # own is part of table: any more of every in table is another sequence's
            if len(every.intersection(table)) != len(set(own)):
                raise ShapeError("blocks written", f"slot {slot}: this {what} writes a block of its table for another sequence")

    def check_table(self, slot: int, table: list[int], positions: int) -> None:
        """A block table that covers `positions` positions with distinct blocks of the pool."""
        need = -(-positions // self.block_size)
        if not need <= len(table) <= self.max_blocks:
            raise ShapeError("block table length",
                             f"slot {slot}: {len(table)} blocks for {positions} positions "
                             f"(needs {need}, at most {self.max_blocks})")
        if table and (min(table) < 0 or max(table) >= self.num_blocks):
            raise ShapeError("block ids", f"slot {slot}: block ids must lie in [0, {self.num_blocks})")
        if len(set(table)) != len(table):
            raise ShapeError("block ids distinct", f"slot {slot}: a block table names a block twice")


@dataclass(frozen=True)
class RankDrafterInfo:
    """What a rank's rank-side drafter was built from (InitReply.drafter on the wire)."""

    kind: str = "none"
    source: str = ""  # the DFlash checkpoint folder, or the draft model spec
    max_drafts: int = 0  # the most drafts a propose gives a sequence; 0 = no cap
