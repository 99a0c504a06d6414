"""quant.packed_cache: a second load of the same weights with the same method reads the
packed kernels from disk, bit for bit; a corrupt, foreign or stale file is rebuilt."""
from __future__ import annotations

import logging
import os
import shutil

import pytest
import torch
import torch.multiprocessing as mp

import tp_quant_cache_worker
from tandem.model import quant
from tandem.model.loader import load_model
from tandem.model.quant import cpu_int4, cpu_int8, packed_cache
from test_model_tensor_parallel import free_port
from tiny_models import write_tiny_gguf

pytestmark = pytest.mark.skipif(not (cpu_int4.available() and cpu_int8.available()),
                                reason="no int4 CPU kernel, or no exact int8 GEMM on this CPU")


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("TANDEM_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv(packed_cache.ENV_SWITCH, raising=False)
    return tmp_path / "cache"


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    write_tiny_gguf(str(path))
    return str(path)


def logits_of(model) -> torch.Tensor:
    tokens = torch.arange(3, 23)[None]
    return model(tokens, torch.tensor([0]), model.new_cache(8), torch.arange(8, dtype=torch.int32)[None]).logits


def quantized(spec: str, method: str):
    model = load_model(spec, progress=False)
    quant.quantize(model.model, method, model.tokenizer)
    return model.model


def cache_files(cache_dir) -> list[str]:
    folder = cache_dir / "quantized"
    return sorted(os.listdir(folder)) if folder.is_dir() else []


def forbid_building(monkeypatch):
    def no_build(*args, **kwargs):
        raise AssertionError("the kernels were built again instead of read from the cache")
    monkeypatch.setattr(quant, "build_kernels", no_build)


@pytest.mark.parametrize("method", ["int4", "int8"])
def test_a_second_load_reads_the_kernels_and_computes_the_same_bits(method, tiny_gguf, cache_dir, monkeypatch):
    monkeypatch.setenv(packed_cache.ENV_SWITCH, "0")
    uncached = quantized(tiny_gguf, method)
    assert cache_files(cache_dir) == []  # switched off: nothing written
    monkeypatch.delenv(packed_cache.ENV_SWITCH)

    before = dict(packed_cache.stats)
    built = quantized(tiny_gguf, method)
    assert packed_cache.stats["misses"] == before["misses"] + 1 and packed_cache.stats["writes"] == before["writes"] + 1
    assert len(cache_files(cache_dir)) == 1

    forbid_building(monkeypatch)
    read = quantized(tiny_gguf, method)
    assert packed_cache.stats["hits"] == before["hits"] + 1
    for a, b in zip(quant.linear_sites(built), quant.linear_sites(read)):
        if a.fused is None and not isinstance(a.layers[0], quant.QuantizedLinear):  # int4's float head (cpu_int8.fast)
            assert not isinstance(b.layers[0], quant.QuantizedLinear), a.key
            continue
        kernel_a = a.fused.quantized if a.fused is not None else a.layers[0].kernel
        kernel_b = b.fused.quantized if b.fused is not None else b.layers[0].kernel
        state_a, state_b = kernel_a.state(), kernel_b.state()
        assert state_a.keys() == state_b.keys()
        assert all(torch.equal(state_a[k], state_b[k]) for k in state_a), a.key
    expected = logits_of(uncached)
    assert torch.equal(logits_of(built), expected)
    assert torch.equal(logits_of(read), expected)
    assert torch.equal(quant.linear_weight(read.lm_head), quant.linear_weight(uncached.lm_head))


def _truncate(path):
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)


def _flip_last_byte(path):
    with open(path, "r+b") as f:
        f.seek(-1, os.SEEK_END)
        byte = f.read(1)
        f.seek(-1, os.SEEK_END)
        f.write(bytes([byte[0] ^ 0xFF]))


def _garbage(path):
    with open(path, "wb") as f:
        f.write(b"not a safetensors file")


@pytest.mark.parametrize("damage", [_truncate, _flip_last_byte, _garbage], ids=["truncated", "flipped", "garbage"])
def test_a_corrupt_cache_file_is_rebuilt_with_a_warning(damage, tiny_gguf, cache_dir, caplog):
    expected = logits_of(quantized(tiny_gguf, "int4"))
    (name,) = cache_files(cache_dir)
    path = cache_dir / "quantized" / name
    damage(path)
    before = dict(packed_cache.stats)
    with caplog.at_level(logging.WARNING, logger="tandem.model"):
        rebuilt = quantized(tiny_gguf, "int4")
    assert any("not used" in r.getMessage() and name in r.getMessage() for r in caplog.records)
    assert packed_cache.stats["misses"] == before["misses"] + 1
    assert torch.equal(logits_of(rebuilt), expected)
    assert quantized(tiny_gguf, "int4") is not None and packed_cache.stats["hits"] == before["hits"] + 1  # rewritten whole


def test_a_file_written_for_another_key_is_not_read(tiny_gguf, cache_dir, caplog):
    quantized(tiny_gguf, "int8")
    expected = logits_of(quantized(tiny_gguf, "int4"))
    int4_file, int8_file = (cache_dir / "quantized" / n for n in cache_files(cache_dir))
    shutil.copy(int8_file, int4_file)  # an int8 file under the int4 name
    before = dict(packed_cache.stats)
    with caplog.at_level(logging.WARNING, logger="tandem.model"):
        model = quantized(tiny_gguf, "int4")
    assert any("other weights or another layout" in r.getMessage() for r in caplog.records)
    assert packed_cache.stats["misses"] == before["misses"] + 1
    assert model.model.layers[0].mlp.down_proj.kernel.name == "int4"
    assert torch.equal(logits_of(model), expected)


def test_a_changed_source_file_or_changed_weights_miss(tiny_model_dir, cache_dir, tmp_path, monkeypatch):
    folder = tmp_path / "model"
    shutil.copytree(tiny_model_dir("llama"), folder)
    quantized(str(folder), "int4")
    forbid_building(monkeypatch)
    quantized(str(folder), "int4")  # the same files: read
    monkeypatch.undo()
    monkeypatch.setenv("TANDEM_CACHE_DIR", str(cache_dir))

    weights = folder / "model.safetensors"
    stat = weights.stat()
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    before = dict(packed_cache.stats)
    quantized(str(folder), "int4")
    assert packed_cache.stats["misses"] == before["misses"] + 1 and len(cache_files(cache_dir)) == 2

    loaded = load_model(str(folder), progress=False)  # the same files, but a weight changed after loading
    with torch.no_grad():
        loaded.model.model.layers[1].mlp.down_proj.weight.mul_(2)
    quant.quantize(loaded.model, "int4")
    assert packed_cache.stats["misses"] == before["misses"] + 2 and len(cache_files(cache_dir)) == 3


def test_a_model_the_loader_did_not_read_is_not_cached(tiny_gguf, cache_dir):
    model = load_model(tiny_gguf, progress=False).model
    del model.weights_source
    assert packed_cache.for_model(model, "int4") is None
    quant.quantize(model, "int4")
    assert cache_files(cache_dir) == []


@pytest.mark.timeout(240)
def test_two_ranks_each_cache_their_share_and_rebuild_together(tiny_model_dir, cache_dir, tmp_path):
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    mp.spawn(tp_quant_cache_worker.worker, args=(2, free_port(), tiny_model_dir("llama"), str(out_dir)),
             nprocs=2, join=True)
    files = cache_files(cache_dir)
    assert len(files) == 2 and any("rank0of2" in f for f in files) and any("rank1of2" in f for f in files)
    for rank in (0, 1):
        result = torch.load(out_dir / f"rank{rank}.pt")
        cold, warm, one_missing = result["logits"]
        assert torch.equal(warm, cold) and torch.equal(one_missing, cold)
        # cold: miss; warm: hit; one rank's file removed: both ranks build (and calibrate) again
        assert result["hits"] == [0, 1, 1] and result["misses"] == [1, 1, 2]
    assert torch.equal(torch.load(out_dir / "rank0.pt")["logits"][0], torch.load(out_dir / "rank1.pt")["logits"][0])
