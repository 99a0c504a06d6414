"""load_model: a spec (known name, .gguf file, local folder, hub name) -> our model + tokenizer.

GGUF files are dequantized once by transformers (slow: ~18 s for SmolLM2, mostly parsing
metadata) and cached as a plain safetensors folder; every later load reads that folder
straight into our LlamaForCausalLM, with no HF model built.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import shutil
import tempfile
import uuid
from dataclasses import dataclass
from typing import Any

import torch
from tqdm import tqdm

from tandem.model import gguf_types, registry
from tandem.model.config import ModelConfig
from tandem.model.llama import LlamaForCausalLM
from tandem.model.registry import model_name

# Tokens that end a turn or a document in the chat models we serve. `<|im_start|>` is
# never one, whatever a converted tokenizer claims.
STOP_TOKENS = ("<|im_end|>", "<|endoftext|>")
NOT_STOP_TOKENS = ("<|im_start|>",)


@dataclass
class LoadedModel:
    model: LlamaForCausalLM
    config: ModelConfig
    hf_config: Any  # the transformers config it was read from
    tokenizer: Any  # a transformers tokenizer, or None for a folder without tokenizer files
    eos_token_ids: tuple[int, ...]
    name: str
    chat_template: str | None
    path: str  # the folder the weights were read from (the cache folder for a GGUF)
    source_quantized: bool = False  # read from a GGUF whose tensors are quantized (model.quant's "auto" reads it)


def cache_root() -> str:
    return os.environ.get("TANDEM_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "tandem", "models")


def load_model(spec: str | None = None, *, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
               progress: bool = True) -> LoadedModel:
    """Load `spec`: None or a known name (registry.KNOWN_MODELS, default SmolLM2-135M-Instruct),
    a path to a .gguf file, a folder with config.json + *.safetensors, or a hub name."""
    with tqdm(total=2, desc=f"loading {spec or registry.DEFAULT_MODEL}", unit="step", disable=not progress) as bar:
        name, folder = resolve_model_folder(spec, bar)
        bar.update()
        bar.set_postfix_str("reading weights")
        loaded = _load_folder(folder, name, dtype, device)
        loaded.source_quantized = _source_quantized(spec, folder)
        bar.update()
    return loaded


@dataclass
class LoadedTokenizer:
    tokenizer: Any
    eos_token_ids: tuple[int, ...]
    name: str
    chat_template: str | None
    path: str


def load_tokenizer(spec: str | None = None, *, progress: bool = True) -> LoadedTokenizer:
    """The tokenizer side of `load_model(spec)`, without the weights (for a scheduler whose
    model lives in shard processes)."""
    from transformers import AutoConfig

    with tqdm(total=1, desc=f"tokenizer of {spec or registry.DEFAULT_MODEL}", unit="step", disable=not progress) as bar:
        name, folder = resolve_model_folder(spec, bar)
        tokenizer = _load_tokenizer(folder)
        has_config = os.path.isfile(os.path.join(folder, "config.json"))
        eos_token_ids = _eos_token_ids(folder, AutoConfig.from_pretrained(folder) if has_config else None, tokenizer)
        bar.update()
    return LoadedTokenizer(tokenizer, eos_token_ids, name, getattr(tokenizer, "chat_template", None), folder)


def resolve_model_folder(spec: str | None, bar=None) -> tuple[str, str]:
    """(name, folder holding config.json + *.safetensors) for `spec`, dequantizing a GGUF once."""
    spec = spec or registry.DEFAULT_MODEL
    bar = bar if bar is not None else tqdm(disable=True)
    name = model_name(spec)
    known = registry.lookup(spec)
    if known is not None:
        return name, _known_model_folder(known, bar)
    if spec.endswith(".gguf"):
        if not os.path.isfile(spec):
            raise FileNotFoundError(f"model spec {spec!r}: no such .gguf file")
        return name, _cached_dequantized(spec, name, _sha256(spec), bar)
    if os.path.isdir(spec):
        return name, spec
    if os.path.exists(spec) or spec.startswith((".", "/", "~")):
        raise FileNotFoundError(f"model spec {spec!r} is neither a .gguf file nor a model folder")
    return name, _hub_snapshot(spec)


def _load_folder(folder: str, name: str, dtype: torch.dtype, device) -> LoadedModel:
    from safetensors import safe_open
    from transformers import AutoConfig

    files = sorted(glob.glob(os.path.join(folder, "*.safetensors")))
    if not os.path.isfile(os.path.join(folder, "config.json")) or not files:
        raise FileNotFoundError(f"model folder {folder!r} needs config.json and *.safetensors")
    hf_config = AutoConfig.from_pretrained(folder)
    config = ModelConfig.from_hf(hf_config)
    state = {}
    for file in files:
        with safe_open(file, framework="pt") as f:
            # Cast one tensor at a time: the float32 cache is never all in memory beside its bf16 copy.
            state.update((key, f.get_tensor(key).to(device=device, dtype=dtype)) for key in f.keys())
    model = LlamaForCausalLM.from_state_dict(config, state, dtype=dtype, device=device)
    model.weights_source = weights_source(folder)  # what quant.packed_cache keys a model's kernels by
    tokenizer = _load_tokenizer(folder)
    return LoadedModel(
        model=model, config=config, hf_config=hf_config, tokenizer=tokenizer,
        eos_token_ids=_eos_token_ids(folder, hf_config, tokenizer), name=name,
        chat_template=getattr(tokenizer, "chat_template", None), path=folder,
    )


SOURCE_FILES = ("*.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json")


def weights_source(folder: str) -> dict:
    """The identity of a model folder's weights: its real path, and the name, size and mtime
    of each file a load reads (a GGUF's cache folder is named by the GGUF's sha256)."""
    files = sorted({path for pattern in SOURCE_FILES for path in glob.glob(os.path.join(folder, pattern))})
    stats = [(os.path.basename(path), os.stat(path)) for path in files]
    return {"folder": os.path.realpath(folder), "files": [[name, st.st_size, st.st_mtime_ns] for name, st in stats]}


SOURCE_FILE = "gguf_source.json"  # written into a GGUF's cache folder: the file's tensor types


def _source_quantized(spec: str | None, folder: str) -> bool:
    """Whether the weights in `folder` were dequantized from quantized GGUF tensors."""
    marker = os.path.join(folder, SOURCE_FILE)
    if os.path.isfile(marker):
        with open(marker) as f:
            return gguf_types.is_quantized(json.load(f)["tensor_types"])
    known = registry.lookup(spec or registry.DEFAULT_MODEL)
    gguf = known.gguf_path() if known is not None else (spec if spec and spec.endswith(".gguf") else None)
    if gguf is None or not os.path.isfile(gguf):
        return False  # a plain folder, or a cache of parts made without the marker
    types = gguf_types.tensor_types(gguf)
    try:  # written aside and renamed into place: a reader never sees half of it
        tmp = f"{marker}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        with open(tmp, "w") as f:
            json.dump({"tensor_types": types}, f)
        os.replace(tmp, marker)
    except OSError:
        pass  # a read-only cache: the header is read again next time
    return gguf_types.is_quantized(types)


def _load_tokenizer(folder: str):
    # A unit-test folder may carry no tokenizer at all.
    if not any(os.path.isfile(os.path.join(folder, f)) for f in ("tokenizer.json", "tokenizer_config.json")):
        return None
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(folder)


def _eos_token_ids(folder: str, hf_config, tokenizer) -> tuple[int, ...]:
    """Union of the config's, generation config's and tokenizer's eos, plus the chat stop tokens."""
    ids: set[int] = set()

    def add(value):
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, (list, tuple)):
            ids.update(v for v in value if isinstance(v, int))

    add(getattr(hf_config, "eos_token_id", None))
    generation_config = os.path.join(folder, "generation_config.json")
    if os.path.isfile(generation_config):
        with open(generation_config) as f:
            add(json.load(f).get("eos_token_id"))
    if tokenizer is not None:
        add(tokenizer.eos_token_id)
        vocab = tokenizer.get_vocab()
        ids.update(vocab[t] for t in STOP_TOKENS if t in vocab)
        ids.difference_update(vocab[t] for t in NOT_STOP_TOKENS if t in vocab)
    return tuple(sorted(ids))


def _known_model_folder(known: registry.KnownModel, bar) -> str:
    target = os.path.join(cache_root(), f"{known.name}-{known.sha256[:12]}")
    if os.path.isdir(target):  # the cheap path: no look at the packages at all
        return target
    gguf = known.gguf_path()
    if gguf is not None:
        return _cached_dequantized(gguf, known.name, known.sha256, bar, verify=True)
    with tempfile.TemporaryDirectory(dir=_ensure_dir(cache_root()), prefix=f".{known.name}-join-") as tmp:
        joined = os.path.join(tmp, f"{known.name}.gguf")
        bar.set_postfix_str(f"joining {len(known.part_modules)} parts")
        _join_parts(known.part_paths(), joined, known.sha256)
        return _cached_dequantized(joined, known.name, known.sha256, bar)


def _join_parts(parts: list[str], out_path: str, sha256: str) -> None:
    with open(out_path, "wb") as out:
        joined = _sha256(*parts, copy_to=out)
    if joined != sha256:
        raise ValueError(f"joined GGUF {out_path!r} has sha256 {joined}, expected {sha256}")


def _sha256(*paths: str, copy_to=None) -> str:
    """sha256 of the files read one after another, optionally writing them out as they are read."""
    digest = hashlib.sha256()
    for path in paths:
        with open(path, "rb") as f:
            while chunk := f.read(1 << 24):
                digest.update(chunk)
                if copy_to is not None:
                    copy_to.write(chunk)
    return digest.hexdigest()


def _ensure_dir(path: str) -> str:
    os.makedirs(path, exist_ok=True)
    return path


def _cached_dequantized(gguf: str, name: str, sha256: str, bar, verify: bool = False) -> str:
    """The cache folder of `gguf` (float32 safetensors + config + tokenizer), made if missing."""
    target = os.path.join(cache_root(), f"{name}-{sha256[:12]}")
    if os.path.isdir(target):
        return target
    if verify and _sha256(gguf) != sha256:
        raise ValueError(f"{gguf!r} does not have the expected sha256 {sha256}")
    types = gguf_types.check_types(gguf)  # an unsupported type is refused before the slow part
    bar.set_postfix_str("dequantizing GGUF once (cached after)")
    # Build in a private temp folder and rename it into place: a reader never sees half a
    # cache, and of two processes building at once the second simply drops its copy.
    tmp = os.path.join(_ensure_dir(cache_root()), f".{os.path.basename(target)}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
        _dequantize_gguf(gguf, tmp, progress=not bar.disable)
        with open(os.path.join(tmp, SOURCE_FILE), "w") as f:
            json.dump({"tensor_types": types}, f)
        try:
            os.rename(tmp, target)
        except OSError:
            if not os.path.isdir(target):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _dequantize_gguf(gguf: str, out_dir: str, progress: bool) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    folder, file = os.path.split(os.path.abspath(gguf))
    bars_were_on = hf_logging.is_progress_bar_enabled()
    if not progress:
        hf_logging.disable_progress_bar()
    try:
        # Always float32: a bf16 load casts from it, which is what dequantizing to bf16 does too.
        hf_model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=file, dtype=torch.float32)
    finally:
        if bars_were_on:
            hf_logging.enable_progress_bar()
    ModelConfig.from_hf(hf_model.config)  # refuse an unsupported architecture before writing anything
    hf_model.hf_quantizer = None  # the weights are plain tensors now; save them as such
    if hasattr(hf_model.config, "quantization_config"):
        del hf_model.config.quantization_config
    hf_model.save_pretrained(out_dir)
    AutoTokenizer.from_pretrained(folder, gguf_file=file).save_pretrained(out_dir)


def _hub_snapshot(spec: str) -> str:
    try:
        from huggingface_hub import snapshot_download
        return snapshot_download(spec, allow_patterns=["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja"])
    except Exception as e:  # offline, unknown repo, bad name: all mean "cannot load this spec"
        known = ", ".join(m.name for m in registry.KNOWN_MODELS)
        raise ValueError(f"cannot load model {spec!r}: not a known name ({known}), not a local .gguf file or "
                         f"model folder, and the hub did not provide it ({type(e).__name__}: {e})") from e
