"""Which GGUF tensor types tandem loads, checked before the (slow) dequantization.

A GGUF is dequantized once to float32 (then quantized again to the layout of the kernel
the rank runs, on the CPU once per key: model.quant.packed_cache). Supported are the plain float types and the legacy
and k-quant block types, whose dequantization gguf-py implements and tandem's tests
cover; the i-quants, ternary and other types are refused by name."""
from __future__ import annotations

FLOAT_TYPES = ("F32", "F16", "BF16")
QUANTIZED_TYPES = ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q8_K")
SUPPORTED = FLOAT_TYPES + QUANTIZED_TYPES


class UnsupportedGGUFType(ValueError):
    pass


def tensor_types(path: str) -> dict[str, str]:
    """{tensor name: GGML type name} of a GGUF file (reads only its header)."""
    from gguf import GGUFReader

    return {t.name: t.tensor_type.name for t in GGUFReader(path, "r").tensors}


def check_types(path: str) -> dict[str, str]:
    """The file's tensor types; raises UnsupportedGGUFType naming each unsupported type (and
    a tensor that has it) and the types that are supported."""
    types = tensor_types(path)
    bad: dict[str, str] = {}
    for name, kind in types.items():
        if kind not in SUPPORTED:
            bad.setdefault(kind, name)
    if bad:
        found = ", ".join(f"{kind} (e.g. {name})" for kind, name in sorted(bad.items()))
        raise UnsupportedGGUFType(f"{path}: GGUF quantization type(s) not supported: {found}; "
                                  f"supported: {', '.join(SUPPORTED)}")
    return types


def is_quantized(types: dict[str, str]) -> bool:
    """True when any tensor is stored in a quantized block type."""
    return any(kind in QUANTIZED_TYPES for kind in types.values())
