#!/usr/bin/env bash
# Smoke run of the GPU path, for the day a GPU is at hand: one command, at most 10 minutes on one GPU.
#
#   bash scripts/gpu_smoke.sh [--cpu] [--no-vllm] [--model smollm2|tiny] [--json PATH] [--workdir DIR]
#
# With a GPU (nvidia-smi lists one) it first installs the GPU stack when it is absent (vLLM's CUDA build through
# scripts/install.sh --vllm, and the gpu extra's DeepSpeed; flash-attn is not needed here: transformers uses sdpa),
# then runs scripts/gpu_smoke.py --device cuda: SmolLM2 through the evaluate stage on vLLM, 3 colocate training
# steps each of GRPO and GRAIL through pipeline.launch, and benchmarks/credit_overhead.py on a Qwen3-shaped model
# with the real vocabulary. Without a GPU, or with --cpu, it runs the CPU fallback (tests/benchmarks/
# test_gpu_smoke.py runs it in CI so that the script cannot rot). Either way it prints one table: stage, seconds,
# pass/fail, GRAIL/GRPO step ratio, peak memory; the exit status is 1 when a stage fails. On a GPU machine without
# PyPI, --no-vllm --model tiny installs nothing and runs the CUDA stages on the hf backend and the tiny model.
set -euo pipefail
cd "$(dirname "$0")/.."

device=cuda
if [ "${1:-}" = --cpu ]; then
  device=cpu
  shift
elif ! { command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; }; then
  echo "gpu_smoke: no GPU visible (nvidia-smi): running the CPU fallback" >&2
  device=cpu
fi

if [ "$device" = cuda ] && [[ " $* " != *" --no-vllm "* ]]; then
  if ! python3 -c "import importlib.metadata as m; m.distribution('vllm')" 2>/dev/null; then
    bash scripts/install.sh --vllm
  fi
  if ! python3 -c "import deepspeed" 2>/dev/null; then
    python3 -m pip install --quiet "$(python3 -c 'import tomllib; print(next(r for r in tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["gpu"] if r.startswith("deepspeed")))')"
  fi
fi
exec python3 scripts/gpu_smoke.py --device "$device" "$@"
