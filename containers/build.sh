#!/usr/bin/env bash
# Build the project images from the repository root. This script is the one place that names them.
#
#   containers/build.sh gpu         # localhost/grail-pipeline:TAG-gpu from the pinned CUDA base (needs a registry
#                                   #   for the base)
#   containers/build.sh cpu         # localhost/grail-pipeline:TAG-cpu from CPU_BASE_IMAGE (default: the local
#                                   #   Debian base that scripts/build_base_image.sh makes, so no registry is needed)
#   containers/build.sh apptainer   # containers/grail.sif from the gpu image (podman save + apptainer build): the
#                                   #   study config's default `container_image` (snakemake --sdm apptainer)
#   IMAGE=registry.example.org/grail/grail-pipeline containers/build.sh push
#                                   # tags the built images IMAGE:TAG-gpu and IMAGE:TAG-cpu and pushes them; the
#                                   #   Kubernetes profile's `container-image` is IMAGE:TAG-gpu
#   containers/build.sh names       # prints what the other commands write: "gpu REF", "cpu REF", "apptainer FILE"
#
# Env: IMAGE (your registry's name for the image; only `push` reads it), TAG (default: the project version in
#      pyproject.toml), ENGINE (podman, docker or buildah; default: the first one installed), CPU_BASE_IMAGE,
#      BUILD_OPTS (extra build flags, e.g. build-time mounts of a local wheel directory:
#      "-v /opt/wheels:/wheels:ro --build-arg PIP_FIND_LINKS=/wheels").
set -euo pipefail
cd "$(dirname "$0")/.."

LOCAL_IMAGE=localhost/grail-pipeline
SIF=containers/grail.sif
IMAGE=${IMAGE:-}
TAG=${TAG:-$(sed -n 's/^version = "\(.*\)"$/\1/p' pyproject.toml)}
CPU_BASE_IMAGE=${CPU_BASE_IMAGE:-localhost/debian-py:bookworm}
BUILD_OPTS=${BUILD_OPTS:-}
if [ "${1:-}" = names ]; then
  for variant in gpu cpu; do echo "$variant $LOCAL_IMAGE:$TAG-$variant"; done
  echo "apptainer $SIF"
  [ -z "$IMAGE" ] || for variant in gpu cpu; do echo "push $IMAGE:$TAG-$variant"; done
  exit 0
fi
if [ -z "${ENGINE:-}" ]; then
  for candidate in podman docker buildah; do
    if command -v "$candidate" >/dev/null; then ENGINE=$candidate && break; fi
  done
fi
: "${ENGINE:?no container engine found (podman, docker or buildah)}"

build() {  # build VARIANT [extra build flags...]
  local variant=$1
  shift
  local build_command=(build)
  [ "$ENGINE" = buildah ] && build_command=(bud)
  # shellcheck disable=SC2086  # BUILD_OPTS is a list of flags
  "$ENGINE" "${build_command[@]}" -f containers/Dockerfile --build-arg "VARIANT=$variant" "$@" $BUILD_OPTS \
    -t "$LOCAL_IMAGE:$TAG-$variant" .
  echo "built $LOCAL_IMAGE:$TAG-$variant"
}

case "${1:-}" in
  gpu) build gpu ;;
  cpu) build cpu --build-arg "BASE_IMAGE=$CPU_BASE_IMAGE" ;;
  apptainer)
    command -v apptainer >/dev/null || { echo "apptainer is not installed" >&2; exit 1; }
    case "$ENGINE" in
      podman) podman save --format docker-archive -o containers/grail-pipeline-gpu.tar "$LOCAL_IMAGE:$TAG-gpu" ;;
      docker) docker save -o containers/grail-pipeline-gpu.tar "$LOCAL_IMAGE:$TAG-gpu" ;;
      buildah) buildah push "$LOCAL_IMAGE:$TAG-gpu" docker-archive:containers/grail-pipeline-gpu.tar ;;
    esac
    apptainer build --force "$SIF" containers/grail.def
    rm -f containers/grail-pipeline-gpu.tar
    ;;
  push)
    : "${IMAGE:?set IMAGE to the image name in your registry, e.g. registry.example.org/grail/grail-pipeline}"
    for variant in gpu cpu; do
      "$ENGINE" tag "$LOCAL_IMAGE:$TAG-$variant" "$IMAGE:$TAG-$variant"
      "$ENGINE" push "$IMAGE:$TAG-$variant"
    done
    ;;
  *)
    echo "usage: $0 gpu|cpu|apptainer|push|names" >&2
    exit 2
    ;;
esac
