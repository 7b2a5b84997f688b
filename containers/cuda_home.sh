#!/usr/bin/env bash
# Assemble a CUDA toolkit directory (CUDA_HOME) from PyPI wheels, for compiling CUDA extensions against the image's
# torch without a CUDA base image: the Dockerfile's FLASH_ATTN=source uses it, and containers/check_image.sh builds a
# small extension with it. Run as root inside the image:
#
#   bash containers/cuda_home.sh DIR     # then: export CUDA_HOME=DIR PATH=DIR/bin:$PATH
#
# The compiler and its headers come at torch's CUDA release (torch.version.cuda): nvidia-cuda-nvcc, -runtime, -cccl
# (and, for CUDA 13, nvidia-cuda-crt and nvidia-nvvm), installed with --target into DIR.wheels, not into the image's
# environment: the stack's own nvidia-cuda-nvcc (a vLLM dependency) is at a later CUDA minor, whose compiler does not
# match torch's headers. The libraries' headers (cuBLAS, cuSPARSE, cuDNN, NCCL, ...) are the stack's. DIR holds
# symbolic links only; delete DIR and DIR.wheels afterwards.
set -euo pipefail
home=${1:?usage: $0 DIR}
wheels=$home.wheels
cuda=$(python -c 'import torch; print(torch.version.cuda or "")')
[ -n "$cuda" ] || { echo "this torch is not a CUDA build" >&2; exit 1; }
major=${cuda%%.*}
suffix=""
if [ "$major" = 12 ]; then suffix=-cu12; fi
packages="nvidia-cuda-nvcc$suffix nvidia-cuda-runtime$suffix nvidia-cuda-cccl$suffix"
if [ "$major" != 12 ]; then packages="$packages nvidia-cuda-crt nvidia-nvvm"; fi
requirements=()
for package in $packages; do requirements+=("$package==$cuda.*"); done
# one pip call: a second --target install into the same directory would skip the shared nvidia/ tree
pip install --no-cache-dir --no-deps --quiet --target "$wheels" "${requirements[@]}"
site=$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
mkdir -p "$home/bin" "$home/include" "$home/lib64"
for dir in "$wheels"/nvidia/*/ "$site"/nvidia/*/; do  # the toolkit's files first: -n keeps them
  if [ -d "$dir/bin" ]; then cp -rsn "$dir/bin/." "$home/bin/"; fi
  if [ -d "$dir/include" ]; then cp -rsn "$dir/include/." "$home/include/"; fi
  if [ -d "$dir/nvvm" ]; then cp -rsn "$dir/nvvm" "$home/"; fi
  if [ -d "$dir/lib" ]; then cp -rsn "$dir/lib/." "$home/lib64/"; fi
done
for lib in "$home"/lib64/lib*.so.*; do ln -sf "$lib" "${lib%%.so.*}.so"; done
"$home/bin/nvcc" --version | tail -n 1
