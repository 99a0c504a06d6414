"""Quantized linear layers behind one interface: `quantize(model, method)`.

Methods by device:
  cpu   int8  int8 weights (per channel; 7 bits where 8 are not exact) x int8 activations (per row), oneDNN
        int4  int4 weights (groups of 32) x bf16 activations, torch's CPU kernel;
              the LM head int8 where the CPU has VNNI or AMX, else float
  cuda  fp8   E4M3 weights (per channel) x E4M3 activations (per row), torch._scaled_mm
        int4  int4 weights (groups of 64) x bf16 activations, torch's tinygemm kernel
`resolve(...)` turns the config's `quantization` ("auto", "none" or a method) into the
method a rank uses: "auto" is int4 on the CPU for weights that ship quantized (a
quantized GGUF) unless dtype is set to float32, and none otherwise.
"""
from __future__ import annotations

import logging

import torch

from tandem.model.quant import packed_cache
from tandem.model.quant.linear import QuantizedLinear, linear_sites, linear_weight, quantize_model

__all__ = ["QuantizedLinear", "linear_weight", "quantize", "resolve", "METHODS", "CHOICES"]

log = logging.getLogger("tandem.model")

METHODS = {"cpu": ("int8", "int4"), "cuda": ("fp8", "int4")}
CHOICES = ("auto", "none", "int8", "int4", "fp8")


def resolve(requested: str, device: torch.device, dtype_requested: str, source_quantized: bool) -> str:
    """The method a rank on `device` runs ("none" for plain weights); raises ValueError naming
    what this device offers where `requested` is not one of them."""
    if requested not in CHOICES:
        raise ValueError(f"quantization {requested!r} is not one of {', '.join(CHOICES)}")
    if requested == "auto":
        return "int4" if device.type == "cpu" and source_quantized and dtype_requested == "auto" else "none"
    if requested == "none":
        return "none"
    offered = METHODS.get(device.type, ())
    if requested not in offered:
        raise ValueError(f"quantization {requested!r} does not run on {device.type}; "
                         f"{device.type} offers: {', '.join(offered) or 'none'}")
    return requested


def _kernel_class(method: str, device: torch.device):
    if device.type == "cpu":
        from tandem.model.quant import cpu_int4, cpu_int8

        if method == "int8" and not cpu_int8.available():
            raise ValueError(f"quantization 'int8': {cpu_int8.unusable()}")
        if method == "int4" and not cpu_int4.available():
            raise ValueError("quantization 'int4': this torch build lacks its CPU kernel")
        if method == "int8" and not cpu_int8.fast():
            log.warning("quantization 'int8' on a CPU without int8 dot-product instructions (VNNI, AMX) runs "
                        "slower than float32 (0.2-0.3x on an AVX2-only CPU); int4 or float32 is faster here")
        return cpu_int8.Int8CpuKernel if method == "int8" else cpu_int4.Int4CpuKernel
    from tandem.model.quant import cuda_fp8, cuda_int4

    module = {"fp8": cuda_fp8, "int4": cuda_int4}[method]
    if not module.available(device):
        raise ValueError(f"quantization {method!r}: this GPU or torch build lacks its kernel "
                         "(fp8 needs compute capability 8.9 or later)")
    return module.Fp8CudaKernel if method == "fp8" else module.Int4CudaKernel


def quantize(model, method: str, tokenizer=None) -> int:
    """Quantize `model`'s linear layers in place with `method` (see resolve); returns the
    bytes the quantized weights take (0 for "none"). int8 activations are calibrated
    first (calibrate.py) with one forward of the float model over `tokenizer`'s ids of a
    fixed text: on a tensor-parallel model every rank must call this at once. With int4
    on the CPU the LM head takes int8 (as a GGUF ships it: Q8_0 beside Q4 layers): at 4 bits
    it alone moved the default model's mean KL against float32 from 0.005 to 0.03. Where
    this CPU's int8 GEMM is not exact, or has no int8 dot-product instructions, the head
    stays float.
    The CPU kernels of a model the loader read are cached on disk (packed_cache): a later
    load of the same weights with the same method reads them instead, bit for bit."""
    if method == "none":
        return 0
    device = model.device
    kernel = _kernel_class(method, device)
    head_kernel = _int4_head(device) if method == "int4" and device.type == "cpu" else kernel
    before = sum(p.numel() * p.element_size() for p in model.parameters())
    sites = [site for site in linear_sites(model) if head_kernel is not None or not site.keep_weight]
    cache = packed_cache.for_model(model, method)
    cached = cache.load(sites) if cache is not None else None
    if cached is not None:
        kernels = quantize_model(model, lambda site: cached[site.key], sites)
    else:
        kernels = build_kernels(model, sites, kernel, head_kernel, tokenizer)
        if cache is not None:
            cache.save(kernels)
    nbytes = sum(k.nbytes for k in kernels.values())
    model.quantization = method
    log.info("weights quantized to %s%s: %.0f MB of linear layers (the float model held %.0f MB)",
             method, f" (read from {cache.path})" if cached is not None else "", nbytes / 1e6, before / 1e6)
    return nbytes


def _int4_head(device: torch.device):
    """The LM head's kernel beside int4 layers on the CPU: int8, or None (the head stays
    float) where this CPU's int8 GEMM is not exact, or slower than float32 (cpu_int8.fast)."""
    from tandem.model.quant import cpu_int8

    if not cpu_int8.available():
        log.warning("int4: the LM head stays float: %s", cpu_int8.unusable())
        return None
    if not cpu_int8.fast():
        log.info("int4: the LM head stays float: this CPU has no int8 dot-product instructions (VNNI, AMX)")
        return None
    return cpu_int8.Int8CpuKernel


def build_kernels(model, sites, kernel, head_kernel, tokenizer) -> dict:
    """Quantize every site of `model` in place, calibrating first where int8 is used."""
    amax = {}
    if kernel.name == "int8" or getattr(head_kernel, "name", None) == "int8":
        from tandem.model.quant.calibrate import calibration_tokens, input_absmax

        amax = input_absmax(model, calibration_tokens(tokenizer, model.config.vocab_size))

    def make(site):
        chosen = head_kernel if site.keep_weight else kernel
        weight, bias = site.weight_and_bias()
        if chosen.name == "int8":
            return chosen(weight, bias, keep_weight=site.keep_weight, input_absmax=amax.get(site.key))
        return chosen(weight, bias, keep_weight=site.keep_weight)

    return quantize_model(model, make, sites)
