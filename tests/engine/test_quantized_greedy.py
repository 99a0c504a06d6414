"""On a quantized target (the default model at int8 and int4, as `quantization` builds it)
greedy speculation equals greedy decoding of the same quantized target, token for token,
for every drafter and batch size, requests joining midway; and the quantized target stays
close to the float32 one it came from."""
from __future__ import annotations

import pytest
import torch

from tandem.config import EngineConfig
from tandem.engine import Engine
from tandem.model.loader import load_model
from tandem.model.quant import QuantizedLinear, cpu_int4, cpu_int8
from tandem.sampling_params import SamplingParams
from tandem.shard.factory import ShardSpec, build_model_shard
from tandem.shard.local_group import LocalShardGroup

from .prompts import prompts
from .test_losslessness import run_joining_midway

SLOTS, CONTEXT, MAX_TOKENS = 8, 256, 24
PARAMS = SamplingParams(max_tokens=MAX_TOKENS)


@pytest.fixture(scope="module")
def quantized():
    """A fresh load of the default model (the session's float32 one stays as it is)."""
    return load_model(None, progress=False)


def group(loaded, method: str, **spec) -> LocalShardGroup:
    shard, _ = build_model_shard(
        ShardSpec(num_slots=SLOTS, max_model_len=CONTEXT, row_budget=64, device="cpu", quantization=method, **spec),
        loaded=loaded, progress=False)
    return LocalShardGroup(shard)


def engine(loaded, g, drafter: str, **cfg) -> Engine:
    config = EngineConfig(drafter=drafter, max_num_seqs=SLOTS, max_model_len=CONTEXT, row_budget=64, **cfg)
    return Engine(g, loaded.tokenizer, loaded.eos_token_ids, config)


@pytest.fixture(scope="module")
def int8_group(quantized):
    if not cpu_int8.available():
        pytest.skip(cpu_int8.unusable())
    return group(quantized, "int8")


@pytest.fixture(scope="module")
def reference(quantized, int8_group):
    """The int8 target's own greedy outputs, the 8 requests in one batch (each row's output
    is its own: tests/model's test_a_rows_output_is_the_same_alone_or_in_a_batch for the
    linear layers, test_a_rows_output_is_bitwise_the_same_alone_or_beside_others for the
    attention)."""
    texts = prompts(8)
    return {t: o.token_ids for t, o in zip(texts, engine(quantized, int8_group, "none").generate(texts, PARAMS))}


def check(e, batch, reference):
    texts = prompts(batch)
    outs = run_joining_midway(e, texts, PARAMS)
    assert [o.token_ids for o in outs] == [reference[t] for t in texts]
    assert sum(o.num_draft_tokens for o in outs) > 0, "no drafts were verified"
    return outs


def test_the_rank_runs_quantized_layers_and_leaves_the_given_model_alone(quantized, int8_group):
    model = int8_group.shard.model
    assert model.quantization == "int8" and isinstance(model.lm_head, QuantizedLinear)
    assert quantized.model.quantization == "none" and not isinstance(quantized.model.lm_head, QuantizedLinear)


def test_ngram_on_int8_equals_int8_greedy(quantized, int8_group, reference):
    check(engine(quantized, int8_group, "ngram", adaptive=False), 8, reference)


def test_adaptive_ngram_on_int8_equals_int8_greedy(quantized, int8_group, reference):
    check(engine(quantized, int8_group, "ngram", adaptive=True), 8, reference)


@pytest.fixture(scope="module")
def int4_group(quantized):
    if not cpu_int4.available():
        pytest.skip("no int4 CPU kernel")
    return group(quantized, "int4")


def test_draft_model_on_int8_equals_int8_greedy(quantized, truncated_draft_dir, reference):
    g = group(quantized, "int8", drafter="draft-model", draft_model=truncated_draft_dir)
    check(engine(quantized, g, "draft-model", draft_model=truncated_draft_dir, adaptive=False), 8, reference)


@pytest.fixture(scope="module")
def int4_reference(quantized, int4_group):
    texts = prompts(4)
    return {t: o.token_ids for t, o in zip(texts, engine(quantized, int4_group, "none").generate(texts, PARAMS))}


@pytest.fixture(scope="module")
def dflash_int4_group(quantized, int4_group):
    return group(quantized, "int4", drafter="dflash", num_speculative_tokens=7)


def test_dflash_on_int4_equals_int4_greedy(quantized, dflash_int4_group, int4_reference):
    # the shipped DFlash drafter reads the quantized target's embedding and head
    outs = check(engine(quantized, dflash_int4_group, "dflash", adaptive=False), 4, int4_reference)
    assert sum(o.num_accepted_tokens for o in outs) > 0


def test_dflash_beside_an_int8_head_gives_the_target_heads_logits_of_its_rows(dflash_int4_group):
    from tandem.drafters.dflash.draft_head import Int8Rows

    shard = dflash_int4_group.shard
    head, drafter = shard.model.lm_head, shard.drafter
    if not isinstance(head.kernel, cpu_int8.Int8CpuKernel):
        pytest.skip("the int4 target's LM head stays float on a CPU without int8 dot products")
    assert isinstance(drafter.head, Int8Rows)  # the same codes: half the bytes of bf16 rows
    hidden = torch.randn(5, head.in_features, generator=torch.Generator().manual_seed(0)).to(drafter.dtype)
    assert torch.equal(drafter.head(hidden), head(hidden.float())[:, drafter.draft_vocab])


def test_ngram_on_int4_equals_int4_greedy(quantized, int4_group, int4_reference):
    check(engine(quantized, int4_group, "ngram", adaptive=False), 4, int4_reference)


@pytest.mark.parametrize("method, most_kl", [("int8", 0.05), ("int4", 0.02)])
def test_quantized_stays_close_to_float32(method, most_kl, quantized, request):
    """Teacher-forced over a text: the quantized model's next-token picks mostly agree with float32's."""
    text = " ".join(prompts(8)) * 2
    ids = quantized.tokenizer(text, return_tensors="pt").input_ids[:, :192]

    def logits(model):
        cache = model.new_cache(16, 16)
        tables = torch.arange(1, 13, dtype=torch.int32)[None]
        return model.forward(ids, torch.zeros(1, dtype=torch.int32), cache, tables).logits[0]

    model = request.getfixturevalue(f"{method}_group").shard.model
    ref, out = logits(quantized.model), logits(model)
    agree = (ref.argmax(-1) == out.argmax(-1)).float().mean().item()
    kl = (ref.log_softmax(-1).exp() * (ref.log_softmax(-1) - out.log_softmax(-1))).sum(-1).mean().item()
    assert agree > 0.85 and kl < most_kl, (agree, kl)
