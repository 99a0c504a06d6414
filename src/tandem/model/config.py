"""ModelConfig: the few numbers our Llama-family forward needs, read from a HF config."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "mistral")
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    # None or {"rope_type": "default" | "linear" | "llama3", ...the type's own keys}
    rope_scaling: dict[str, Any] | None = None
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # q/k/v bias (Qwen2, and Llama with attention_bias)
    o_proj_bias: bool = False  # Llama's attention_bias also biases o_proj; Qwen2's o_proj has none
    model_type: str = "llama"

    def __post_init__(self) -> None:
        if self.model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(f"unsupported model_type {self.model_type!r}; supported: {SUPPORTED_MODEL_TYPES}")
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                     "num_kv_heads", "head_dim", "max_position_embeddings"):
            if getattr(self, name) < 1:
                raise ValueError(f"ModelConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for rotary embeddings, got {self.head_dim}")
        rope_type = self.rope_type
        if rope_type not in SUPPORTED_ROPE_TYPES:
            raise ValueError(f"unsupported rope type {rope_type!r}; supported: {SUPPORTED_ROPE_TYPES}")
        needed = {"linear": ("factor",),
                  "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
                  }.get(rope_type, ())
        missing = [key for key in needed if key not in (self.rope_scaling or {})]
        if missing:
            raise ValueError(f"rope type {rope_type!r} needs {missing} in rope_scaling")

    @property
    def rope_type(self) -> str:
        scaling = self.rope_scaling or {}
        return scaling.get("rope_type", scaling.get("type", "default"))

    @property
    def queries_per_kv(self) -> int:
        return self.num_heads // self.num_kv_heads

    @classmethod
    def from_hf(cls, hf_config: Any) -> "ModelConfig":
        """Read a transformers config (LlamaConfig, Qwen2Config, MistralConfig)."""
        model_type = getattr(hf_config, "model_type", None)
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(f"unsupported model_type {model_type!r}; supported: {SUPPORTED_MODEL_TYPES}")
        _reject_sliding_window(hf_config)
        if getattr(hf_config, "mlp_bias", False):
            raise ValueError(f"mlp_bias=True is not supported (model_type {model_type!r})")
        if getattr(hf_config, "hidden_act", "silu") != "silu":
            raise ValueError(f"hidden_act {hf_config.hidden_act!r} is not supported; only 'silu' (SwiGLU)")
        num_heads = hf_config.num_attention_heads
        head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // num_heads
        rope_theta, rope_scaling = _rope_params(hf_config)
        return cls(
            vocab_size=hf_config.vocab_size,
            hidden_size=hf_config.hidden_size,
            intermediate_size=hf_config.intermediate_size,
            num_layers=hf_config.num_hidden_layers,
            num_heads=num_heads,
            num_kv_heads=getattr(hf_config, "num_key_value_heads", None) or num_heads,
            head_dim=head_dim,
            rms_norm_eps=float(hf_config.rms_norm_eps),
            rope_theta=rope_theta,
            rope_scaling=rope_scaling,
            max_position_embeddings=hf_config.max_position_embeddings,
            tie_word_embeddings=bool(getattr(hf_config, "tie_word_embeddings", False)),
            # Qwen2 always has q/k/v bias and has no attention_bias field.
            attention_bias=model_type == "qwen2" or bool(getattr(hf_config, "attention_bias", False)),
            o_proj_bias=model_type != "qwen2" and bool(getattr(hf_config, "attention_bias", False)),
            model_type=model_type,
        )


def _rope_params(hf_config: Any) -> tuple[float, dict[str, Any] | None]:
    """(theta, scaling) from transformers 5 `rope_parameters` or the older `rope_theta` + `rope_scaling`."""
    params = getattr(hf_config, "rope_parameters", None)
    if isinstance(params, dict) and "rope_theta" in params:
        scaling = {key: value for key, value in params.items() if key != "rope_theta"}
        theta = params["rope_theta"]
    else:
        scaling = dict(getattr(hf_config, "rope_scaling", None) or {})
        theta = getattr(hf_config, "rope_theta", 10000.0)
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    return float(theta), (None if rope_type == "default" else scaling)


def _reject_sliding_window(hf_config: Any) -> None:
    # Our attention is full causal; a window shorter than the context would give other logits.
    window = getattr(hf_config, "sliding_window", None)
    uses_window = getattr(hf_config, "use_sliding_window", window is not None)
    if uses_window and window is not None and window < hf_config.max_position_embeddings:
        raise ValueError(f"sliding-window attention (window {window}) is not supported "
                         f"for model_type {hf_config.model_type!r}")
