#!/usr/bin/env bash
# Build the project images from the repository root. This script is the one place that names them.
#
#   containers/build.sh gpu         # localhost/grail-pipeline:TAG-gpu from GPU_BASE_IMAGE (default: the local Debian
#                                   #   base that scripts/build_base_image.sh makes: no registry; CUDA from PyPI wheels)
#   containers/build.sh cpu         # localhost/grail-pipeline:TAG-cpu from CPU_BASE_IMAGE (the same default base)
#   containers/build.sh save        # containers/grail-pipeline-gpu.tar: the gpu image saved as a docker-archive file
#                                   #   (several GB), to carry to a cluster that has Apptainer but no container engine
#   containers/build.sh apptainer   # containers/grail.sif from that archive when it is there (a cluster's login node:
#                                   #   no engine needed), else from the gpu image (save + apptainer build): the study
#                                   #   config's default `container_image` (snakemake --sdm apptainer)
#   IMAGE=registry.example.org/grail/grail-pipeline containers/build.sh push
#                                   # tags the built images IMAGE:TAG-gpu and IMAGE:TAG-cpu and pushes them; the
#                                   #   Kubernetes profile's `container-image` is IMAGE:TAG-gpu. Refused for a TAG
#                                   #   ending in -dirty: commit first
#   containers/build.sh names       # prints what the other commands write: "gpu REF", "cpu REF", "apptainer FILE"
#
# Env: IMAGE (your registry's name for the image; only `push` reads it), TAG (default: VERSION-COMMIT, the project
#      version in pyproject.toml and the checkout's commit (12 hex digits), with -dirty when what the image copies has
#      uncommitted changes: a rebuilt image never reuses a tag that nodes may have pulled and cached), ENGINE (podman, docker or buildah; default: the first one installed), CPU_BASE_IMAGE,
#      GPU_BASE_IMAGE (`cuda`: NVIDIA's CUDA devel image, CUDA_BASE_IMAGE below; it needs that registry), FLASH_ATTN (gpu: none (default), source, or a wheel's path or URL; see containers/Dockerfile),
#      CUDA (gpu: 13.0, the default, PyPI's torch and vLLM; 12.9 for drivers older than 580: torch from the PyTorch
#      index and vLLM's +cu129 release wheel, where both are reachable; docs/cluster.md, "The GPU stack's floor"),
#      BUILD_OPTS (extra build flags, e.g. build-time mounts of a local wheel directory:
#      "-v /opt/wheels:/wheels:ro --build-arg PIP_FIND_LINKS=/wheels").
set -euo pipefail
cd "$(dirname "$0")/.."

LOCAL_IMAGE=localhost/grail-pipeline
SIF=containers/grail.sif
ARCHIVE=containers/grail-pipeline-gpu.tar  # the saved GPU image; grail.def bootstraps from it (docker-archive)
IMAGE=${IMAGE:-}
VERSION=$(sed -n 's/^version = "\(.*\)"$/\1/p' pyproject.toml)
COPIED=(containers pyproject.toml Snakefile configs pipeline)  # what containers/Dockerfile copies from the checkout
DIRTY=$(git status --porcelain -- "${COPIED[@]}" 2>/dev/null | head -1)
TAG=${TAG:-$VERSION-$(git rev-parse --short=12 HEAD)${DIRTY:+-dirty}}
DEBIAN_BASE_IMAGE=localhost/debian-py:bookworm  # scripts/build_base_image.sh
# NVIDIA's CUDA devel image, for sites that want it (GPU_BASE_IMAGE=cuda): its nvcc builds FLASH_ATTN=source, so its
# CUDA major must be torch's (requirements-gpu.txt: torch 2.13.0's PyPI wheel is the CUDA 13.0 build). Named by tag:
# the registry was out of reach where this was written, so pin it at your site by digest (NAME:TAG@sha256:...).
CUDA_BASE_IMAGE=docker.io/nvidia/cuda:13.0.0-cudnn-devel-ubuntu24.04
CPU_BASE_IMAGE=${CPU_BASE_IMAGE:-$DEBIAN_BASE_IMAGE}
GPU_BASE_IMAGE=${GPU_BASE_IMAGE:-$DEBIAN_BASE_IMAGE}
if [ "$GPU_BASE_IMAGE" = cuda ]; then GPU_BASE_IMAGE=$CUDA_BASE_IMAGE; fi
FLASH_ATTN=${FLASH_ATTN:-none}
CUDA=${CUDA:-13.0}
BUILD_OPTS=${BUILD_OPTS:-}
if [ "${1:-}" = names ]; then
  for variant in gpu cpu; do echo "$variant $LOCAL_IMAGE:$TAG-$variant"; done
  echo "save $ARCHIVE"
  echo "apptainer $SIF"
  [ -z "$IMAGE" ] || for variant in gpu cpu; do echo "push $IMAGE:$TAG-$variant"; done
  exit 0
fi
if [ -z "${ENGINE:-}" ]; then
  for candidate in podman docker buildah; do
    if command -v "$candidate" >/dev/null; then ENGINE=$candidate && break; fi
  done
fi
need_engine() { : "${ENGINE:?no container engine found (podman, docker or buildah)}"; }

save() {  # the GPU image as a docker-archive file, which Apptainer builds from on a machine without the engine
  need_engine
  rm -f "$ARCHIVE"
  case "$ENGINE" in
    podman) podman save --format docker-archive -o containers/grail-pipeline-gpu.tar "$LOCAL_IMAGE:$TAG-gpu" ;;
    docker) docker save -o containers/grail-pipeline-gpu.tar "$LOCAL_IMAGE:$TAG-gpu" ;;
    buildah) buildah push "$LOCAL_IMAGE:$TAG-gpu" "docker-archive:$ARCHIVE" ;;
  esac
  echo "saved $LOCAL_IMAGE:$TAG-gpu to $ARCHIVE ($(du -h "$ARCHIVE" | cut -f1))"
}

image_exists() {  # IMAGE: whether the engine has it locally
  case "$ENGINE" in
    podman) podman image exists "$1" ;;
    docker) docker image inspect "$1" >/dev/null 2>&1 ;;
    buildah) buildah inspect --type image "$1" >/dev/null 2>&1 ;;
  esac
}

need_base() {  # BASE_IMAGE: the local Debian base is in no registry: a missing one is named with its build command
  # (not built here: scripts/build_base_image.sh installs packages with apt and needs root, which a build may not have)
  if [ "$1" != "$DEBIAN_BASE_IMAGE" ] || image_exists "$1"; then return 0; fi
  echo "the base image $1 is missing: build it first with \`bash scripts/build_base_image.sh\` (about 2 minutes," \
    "as root: debootstrap, then podman import), or name a base you have: GPU_BASE_IMAGE=... / CPU_BASE_IMAGE=..." >&2
  exit 1
}

cuda_sources() {  # the GPU build's flags for CUDA (none for 13.0: PyPI); stops naming a source out of reach
  case "$CUDA" in
    13.0) ;;
    12.9)
      local index=https://download.pytorch.org/whl/cu129 version wheel
      version=$(sed -n 's/^vllm==//p' containers/requirements-gpu.txt)
      wheel="https://github.com/vllm-project/vllm/releases/download/v$version/vllm-$version+cu129-cp38-abi3-manylinux_2_35_x86_64.whl"
      for url in "$index/torch/" "$wheel"; do
        if ! curl -sfIL --max-time 20 -o /dev/null "$url"; then
          echo "CUDA=12.9 needs $url, which is out of reach from here: build where it is reachable, or put" \
            "the wheels in a directory: BUILD_OPTS=\"-v DIR:/wheels:ro --build-arg PIP_FIND_LINKS=/wheels\"" >&2
          exit 1
        fi
      done
      echo --build-arg "PIP_EXTRA_INDEX_URL=$index" --build-arg "VLLM_WHEEL=$wheel"
      ;;
    *)
      echo "CUDA=$CUDA: 13.0 (default) or 12.9" >&2
      exit 2
      ;;
  esac
}

build() {  # build VARIANT BASE_IMAGE [extra build flags...]
  need_engine
  local variant=$1 base=$2
  shift 2
  need_base "$base"
  local build_command=(build)
  [ "$ENGINE" = buildah ] && build_command=(bud)
  # shellcheck disable=SC2086  # BUILD_OPTS is a list of flags
  "$ENGINE" "${build_command[@]}" -f containers/Dockerfile --build-arg "VARIANT=$variant" \
    --build-arg "BASE_IMAGE=$base" "$@" $BUILD_OPTS \
    -t "$LOCAL_IMAGE:$TAG-$variant" .
  echo "built $LOCAL_IMAGE:$TAG-$variant"
}

case "${1:-}" in
  gpu)
    sources=$(cuda_sources)
    # shellcheck disable=SC2086  # a list of flags without spaces inside them
    build gpu "$GPU_BASE_IMAGE" --build-arg "FLASH_ATTN=$FLASH_ATTN" --build-arg "CUDA=$CUDA" $sources
    ;;
  cpu) build cpu "$CPU_BASE_IMAGE" ;;
  save) save ;;
  apptainer)
    command -v apptainer >/dev/null || { echo "apptainer is not installed" >&2; exit 1; }
    if [ -f "$ARCHIVE" ]; then  # saved elsewhere (containers/build.sh save) and copied here: a cluster's login node
      echo "building $SIF from $ARCHIVE"
      apptainer build --force "$SIF" containers/grail.def
    else
      save
      apptainer build --force "$SIF" containers/grail.def
      rm -f "$ARCHIVE"
    fi
    ;;
  push)
    case "$TAG" in *-dirty) echo "not pushing $TAG: commit first (a pushed tag names the commit it was built from)" >&2; exit 1 ;; esac
    need_engine
    : "${IMAGE:?set IMAGE to the image name in your registry, e.g. registry.example.org/grail/grail-pipeline}"
    for variant in gpu cpu; do
      "$ENGINE" tag "$LOCAL_IMAGE:$TAG-$variant" "$IMAGE:$TAG-$variant"
      "$ENGINE" push "$IMAGE:$TAG-$variant"
    done
    ;;
  *)
    echo "usage: $0 gpu|cpu|save|apptainer|push|names" >&2
    exit 2
    ;;
esac
