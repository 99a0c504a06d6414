"""Grammar masks on the rank: the scheduler's bit rows (one bit a token, 32 tokens to a
little-endian int32 word, as llguidance writes them) turn refused tokens' logits to -inf
before any pick. Applied after the logit processors, so nothing brings a refused token back;
only the rows of constrained sequences are touched."""
from __future__ import annotations

import torch

_BITS = torch.arange(32, dtype=torch.int32)


def unpack(words: torch.Tensor) -> torch.Tensor:
    """[rows, words] int32 -> [rows, 32 * words] bool, token t at bit t % 32 of word t // 32."""
    bits = (words[:, :, None] >> _BITS.to(words.device)) & 1  # [rows, words, 32]
    return bits.view(words.shape[0], -1).bool()


def allowed(mask: bytes, rows: int, vocab: int, device: torch.device) -> torch.Tensor:
    """[rows, vocab] bool from `rows` rows of ceil(vocab/32) words."""
    words = torch.frombuffer(bytearray(mask), dtype=torch.int32).view(rows, -1).to(device)
    return unpack(words)[:, :vocab]


def mask_verify_logits(logits: torch.Tensor, masks: list[bytes] | None) -> torch.Tensor:
    """logits [n, k, V]; masks[i]: sequence i's k rows, b"" = unconstrained."""
    if not masks or not any(masks):
        return logits
    n, k, vocab = logits.shape
    logits = logits.clone()
    for i, m in enumerate(masks):
        if m:
            logits[i].masked_fill_(~allowed(m, k, vocab, logits.device), float("-inf"))
    return logits


def mask_last_logits(logits: torch.Tensor, masks: list[bytes] | None) -> torch.Tensor:
    """logits [n, V] of each sequence's last row; masks[i]: one row or b""."""
    if not masks or not any(masks):
        return logits
    return mask_verify_logits(logits[:, None, :], masks)[:, 0, :]
