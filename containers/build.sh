#!/usr/bin/env bash
# Build the project images from the repository root.
#
#   containers/build.sh gpu         # IMAGE:TAG-gpu from the pinned CUDA base (needs a registry for the base)
#   containers/build.sh cpu         # IMAGE:TAG-cpu from CPU_BASE_IMAGE (default: the local Debian base that
#                                   #   scripts/build_base_image.sh makes, so no registry is needed)
#   containers/build.sh apptainer   # containers/grail.sif from IMAGE:TAG-gpu (podman save + apptainer build)
#   containers/build.sh push        # push IMAGE:TAG-gpu and IMAGE:TAG-cpu to the registry named in IMAGE
#
# Env: IMAGE (default localhost/grail-pipeline; e.g. registry.example.org/grail/grail-pipeline),
#      TAG (default: the project version in pyproject.toml), ENGINE (podman, docker or buildah; default: the
#      first one installed), CPU_BASE_IMAGE, BUILD_OPTS (extra build flags, e.g. build-time mounts of a local
#      wheel directory: "-v /opt/wheels:/wheels:ro --build-arg PIP_FIND_LINKS=/wheels").
set -euo pipefail
cd "$(dirname "$0")/.."

IMAGE=${IMAGE:-localhost/grail-pipeline}
TAG=${TAG:-$(sed -n 's/^version = "\(.*\)"$/\1/p' pyproject.toml)}
CPU_BASE_IMAGE=${CPU_BASE_IMAGE:-localhost/debian-py:bookworm}
BUILD_OPTS=${BUILD_OPTS:-}
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
    -t "$IMAGE:$TAG-$variant" .
  echo "built $IMAGE:$TAG-$variant"
}

case "${1:-}" in
  gpu) build gpu ;;
  cpu) build cpu --build-arg "BASE_IMAGE=$CPU_BASE_IMAGE" ;;
  apptainer)
    command -v apptainer >/dev/null || { echo "apptainer is not installed" >&2; exit 1; }
    case "$ENGINE" in
      podman) podman save --format docker-archive -o containers/grail-pipeline-gpu.tar "$IMAGE:$TAG-gpu" ;;
      docker) docker save -o containers/grail-pipeline-gpu.tar "$IMAGE:$TAG-gpu" ;;
      buildah) buildah push "$IMAGE:$TAG-gpu" docker-archive:containers/grail-pipeline-gpu.tar ;;
    esac
    apptainer build --force containers/grail.sif containers/grail.def
    rm -f containers/grail-pipeline-gpu.tar
    ;;
  push)
    for variant in gpu cpu; do "$ENGINE" push "$IMAGE:$TAG-$variant"; done
    ;;
  *)
    echo "usage: $0 gpu|cpu|apptainer|push" >&2
    exit 2
    ;;
esac
