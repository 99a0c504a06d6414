"""Counter-based random numbers keyed by (seed, position, stream).

Every random choice of a request is a pure function of its seed and the position
of the token it decides, so a seeded request gives the same output whatever else
shares its batch, and the same on any number of ranks.
"""
from __future__ import annotations

import torch

# The three independent streams a token position may draw from.
STREAM_TARGET = 1  # the target's pick (bonus / residual / plain sample)
STREAM_DRAFT = 2  # a draft model's sampled draft
STREAM_ACCEPT = 3  # the uniform of the accept test

_MASK64 = (1 << 64) - 1


def _signed(c: int) -> int:
    return c - (1 << 64) if c >= 1 << 63 else c


_GOLDEN = 0x9E3779B97F4A7C15
_M1 = 0xBF58476D1CE4E5B9
_M2 = 0x94D049BB133111EB


def _mix_int(x: int) -> int:
    """splitmix64 on a Python int."""
    x = (x + _GOLDEN) & _MASK64
    x = ((x ^ (x >> 30)) * _M1) & _MASK64
    x = ((x ^ (x >> 27)) * _M2) & _MASK64
    return x ^ (x >> 31)


def row_key(seed: int, position: int, stream: int) -> int:
    return _mix_int(_mix_int(_mix_int(seed & _MASK64) ^ position) ^ stream)


def uniform(seed: int, position: int, stream: int) -> float:
    """One uniform in (0, 1), on the host."""
    return ((_mix_int(row_key(seed, position, stream)) >> 40) + 0.5) / float(1 << 24)


def _srl(x: torch.Tensor, s: int) -> torch.Tensor:
    # logical right shift of int64 (torch's >> is arithmetic)
    return (x >> s) & ((1 << (64 - s)) - 1)


def _mix_tensor(x: torch.Tensor) -> torch.Tensor:
    # int64 arithmetic wraps, which is what splitmix64 wants.
    x = x + _signed(_GOLDEN)
    x = (x ^ _srl(x, 30)) * _signed(_M1)
    x = (x ^ _srl(x, 27)) * _signed(_M2)
    return x ^ _srl(x, 31)


def uniform_rows(keys: list[int], vocab: int, device: torch.device | str) -> torch.Tensor:
    """Uniforms in (0, 1) of shape [len(keys), vocab]: one independent row per key."""
    k = torch.tensor([_signed(key) for key in keys], dtype=torch.int64, device=device)  # [R]
    idx = torch.arange(vocab, dtype=torch.int64, device=device)  # [V]
    x = _mix_tensor(k[:, None] ^ (idx[None, :] * _signed(_GOLDEN)))  # [R, V]
    return (_srl(x, 40).to(torch.float32) + 0.5) / float(1 << 24)


def sample_rows(probs: torch.Tensor, keys: list[int]) -> torch.Tensor:
    """Draw one token per row of probs [R, V] (exponential race = Gumbel-max), keyed draws."""
    u = uniform_rows(keys, probs.shape[-1], probs.device)  # [R, V]
    race = probs.float() / (-torch.log(u))  # argmax of p / Exp(1) ~ p
    return race.argmax(dim=-1)
