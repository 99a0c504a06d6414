"""Our Llama-family forward against transformers' own, on the same weights, in float32.

Tolerance: max |ours - transformers| <= REL_TOL * max |transformers logit| per prompt.
Measured (torch 2.13 CPU): tiny models up to 6e-7 relative; SmolLM2-135M up to 2.7e-6
relative (8.9e-5 absolute on logits of magnitude ~33). REL_TOL = 1e-5 leaves a margin of ~4x.
"""

from __future__ import annotations

import pytest
import torch

from tiny_models import TINY_VARIANTS
from paged_slots import SlotTables
from tandem.model.loader import load_model

REL_TOL = 1e-5
K = 3  # rows per decode step, like a verify step with gamma = 2


def hf_logits(hf_model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return hf_model(ids[None]).logits[0].float()  # [T, vocab]


def assert_close(ours: torch.Tensor, ref: torch.Tensor, what: str) -> None:
    diff = (ours - ref).abs().max().item()
    scale = ref.abs().max().item()
    assert diff <= REL_TOL * scale, f"{what}: max diff {diff:.3g} > {REL_TOL} * logit scale {scale:.3g}"


def forward(model, cache: SlotTables, rows: list[torch.Tensor], slots: list[int], starts: list[int]):
    return cache(model, torch.stack(rows), slots, starts)


def check_against_reference(model, hf_model, a: torch.Tensor, b: torch.Tensor) -> None:
    """Prompts a, b: [T] with (T - prefix) % K == 0 for both prefixes used below."""
    ref_a, ref_b = hf_logits(hf_model, a), hf_logits(hf_model, b)
    cache = SlotTables(model, num_slots=4, positions=64)

    # Whole prompt in one forward.
    assert_close(forward(model, cache, [a], [1], [0]).logits[0], ref_a, "prefill")

    # A prefix, then K rows at a time through the cache (the verify step's shape).
    prefix = len(a) - 3 * K
    pieces = [forward(model, cache, [a[:prefix]], [2], [0]).logits[0]]
    for start in range(prefix, len(a), K):
        pieces.append(forward(model, cache, [a[start:start + K]], [2], [start]).logits[0])
    assert_close(torch.cat(pieces), ref_a, "prefix + chunks of K")

    # Two sequences in other slots at different positions, in one batched forward per step.
    pa, pb = len(a) - 2 * K, len(b) - 2 * K - 4
    forward(model, cache, [a[:pa]], [0], [0])
    forward(model, cache, [b[:pb]], [3], [0])
    for step in range(2):
        sa, sb = pa + step * K, pb + step * K
        out = forward(model, cache, [a[sa:sa + K], b[sb:sb + K]], [0, 3], [sa, sb])
        assert out.logits.shape == (2, K, ref_a.shape[-1]) and out.logits.dtype == torch.float32
        assert_close(out.logits[0], ref_a[sa:sa + K], f"batched step {step}, sequence a")
        assert_close(out.logits[1], ref_b[sb:sb + K], f"batched step {step}, sequence b")


def tiny_pair(vocab: int = 256) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    return (torch.randint(vocab, (22,), generator=generator), torch.randint(vocab, (25,), generator=generator))


@pytest.mark.parametrize("variant", sorted(TINY_VARIANTS))
def test_tiny_logits_match_transformers_for_prefill_chunked_decode_and_batched_slots(variant, tiny_model_dir):
    from transformers import AutoModelForCausalLM

    folder = tiny_model_dir(variant)
    ours = load_model(folder, progress=False).model
    hf_model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    check_against_reference(ours, hf_model, *tiny_pair())


@pytest.fixture(scope="module")
def smollm2_hf(smollm2):
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(smollm2.path, dtype=torch.float32).eval()


def smollm2_prompts(tokenizer) -> tuple[torch.Tensor, torch.Tensor]:
    a = tokenizer("The quick brown fox jumps over the lazy dog. Once upon a time, in a land far away")
    b = tokenizer("def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) +")
    return torch.tensor(a.input_ids), torch.tensor(b.input_ids)


def test_smollm2_logits_match_transformers_for_prefill_chunked_decode_and_batched_slots(smollm2, smollm2_hf):
    a, b = smollm2_prompts(smollm2.tokenizer)
    assert len(a) >= 20 and len(b) >= 20
    check_against_reference(smollm2.model, smollm2_hf, a, b)


def test_a_verifys_rows_give_bitwise_the_logits_of_one_row_decodes(smollm2):
    """Two sequences verified 5 rows at a time equal each row decoded alone, bit for bit
    (GEMMs, attention, norms): greedy speculation picks what greedy decoding picks."""
    a, b = smollm2_prompts(smollm2.tokenizer)
    model, together, alone = smollm2.model, SlotTables(smollm2.model, 2, 64), SlotTables(smollm2.model, 2, 64)
    pa, pb = len(a) - 5, len(b) - 5
    for cache in (together, alone):
        cache(model, a[None, :pa], [0], [0])
        cache(model, b[None, :pb], [1], [0])
    verify = together(model, torch.stack([a[pa:], b[pb:pb + 5]]), [0, 1], [pa, pb]).logits
    for r in range(5):
        step = alone(model, torch.stack([a[pa + r:pa + r + 1], b[pb + r:pb + r + 1]]), [0, 1], [pa + r, pb + r])
        assert torch.equal(step.logits[:, 0], verify[:, r]), r


def test_captured_layer_i_is_the_output_of_decoder_layer_i(smollm2, smollm2_hf):
    a, _ = smollm2_prompts(smollm2.tokenizer)
    model, last = smollm2.model, smollm2.config.num_layers - 1
    out = SlotTables(model, 1, 32)(model, a[None], [0], [0], capture_layers=(0, 5, last))
    with torch.no_grad():
        hf_hidden = smollm2_hf(a[None], output_hidden_states=True).hidden_states
    assert sorted(out.hidden) == [0, 5, last]
    for i in (0, 5):
        assert_close(out.hidden[i][0], hf_hidden[i + 1][0], f"hidden of layer {i}")
    # HF's last hidden state is after the final norm; ours is the raw layer output.
    assert_close(model.model.norm(out.hidden[last][0]), hf_hidden[last + 1][0], "last layer, normed")
    assert_close(model.final_norm_and_head(out.hidden[last]), out.logits, "head of the last hidden")


def test_rows_written_over_rejected_ones_equal_a_fresh_run(tiny_model_dir):
    model = load_model(tiny_model_dir("qwen2"), progress=False).model
    prompt, rejected, accepted = torch.arange(10, 22), torch.tensor([[7, 8, 9]]), torch.tensor([[40, 41, 42]])
    cache = SlotTables(model, 2, 32)
    cache(model, prompt[None], [1], [0])
    cache(model, rejected, [1], [len(prompt)])  # K/V of rows that will be rejected
    rewound = cache(model, accepted, [1], [len(prompt)]).logits  # the same positions again
    fresh_cache = SlotTables(model, 2, 32, seed=1)
    fresh_cache(model, prompt[None], [1], [0])
    fresh = fresh_cache(model, accepted, [1], [len(prompt)]).logits
    assert torch.equal(rewound, fresh)


def test_wider_block_tables_padded_with_unused_blocks_give_the_same_logits(tiny_model_dir):
    model = load_model(tiny_model_dir("llama"), progress=False).model
    a, b = tiny_pair()
    cache = SlotTables(model, 2, 64)
    cache(model, a[None, :10], [0], [0])
    cache(model, b[None, :6], [1], [0])
    rows, starts = torch.stack([a[10:13], b[6:9]]), torch.tensor([10, 6], dtype=torch.int32)
    narrow = model(rows, starts, cache.cache, cache.tables[:, :4]).logits  # 16 positions: all they reach
    cache(model, a[None, :10], [0], [0])
    cache(model, b[None, :6], [1], [0])
    wide = model(rows, starts, cache.cache, cache.tables).logits
    assert_close(wide, narrow, "a wider table")


def test_forward_refuses_a_missing_layer(tiny_model_dir):
    model = load_model(tiny_model_dir("llama"), progress=False).model
    with pytest.raises(ValueError, match="capture_layers"):
        SlotTables(model, 1, 8)(model, torch.tensor([[1, 2, 3]]), [0], [0], capture_layers=(2,))
