#!/usr/bin/env bash
# Build a local Debian 12 + Python 3.11 base image for podman/buildah without any container registry:
# debootstrap a minimal root filesystem from the Debian mirror apt already uses, then import it.
# It is the base of the CPU variant of containers/Dockerfile on machines that cannot pull images.
#
# Usage:  bash scripts/build_base_image.sh [IMAGE]        # default IMAGE: localhost/debian-py:bookworm
# Env:    DEBIAN_MIRROR (default: the first deb.debian.org-style URI in /etc/apt), SKIP_INSTALL=1 skips apt-get.
# Also writes /etc/containers/containers.conf settings that podman needs on this kind of machine
# (runc as the runtime, explicit ulimits) unless the file already has a [containers] section.
set -euo pipefail
IMAGE=${1:-localhost/debian-py:bookworm}
t0=$(date +%s)

if [ "${SKIP_INSTALL:-0}" != 1 ]; then
  missing=""
  for package in podman buildah runc debootstrap; do dpkg -s "$package" >/dev/null 2>&1 || missing="$missing $package"; done
  if [ -n "$missing" ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    # shellcheck disable=SC2086  # a list of package names
    apt-get install -y -qq --no-install-recommends $missing >/dev/null
  fi
fi

if ! grep -qs '^\[containers\]' /etc/containers/containers.conf; then
  mkdir -p /etc/containers
  cat >>/etc/containers/containers.conf <<'EOF'
[containers]
default_ulimits = ["nofile=1024:1024", "nproc=4096:4096"]

[engine]
runtime = "runc"
EOF
fi

if podman image exists "$IMAGE"; then
  echo "$IMAGE already exists"
  exit 0
fi

if [ -z "${DEBIAN_MIRROR:-}" ]; then
  DEBIAN_MIRROR=$({ grep -rhoE '^(URIs:|deb) +https?://[^ ]+/debian/?( |$)' /etc/apt/sources.list \
    /etc/apt/sources.list.d/ 2>/dev/null || true; } | awk '{print $2}' | head -n1)
fi
DEBIAN_MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
rootfs=$(mktemp -d)
trap 'rm -rf "$rootfs"' EXIT
debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates bookworm "$rootfs" "$DEBIAN_MIRROR" >/dev/null
tar -C "$rootfs" -c . | podman import --change 'CMD ["/bin/bash"]' - "$IMAGE" >/dev/null
echo "built $IMAGE from $DEBIAN_MIRROR in $(($(date +%s) - t0)) s"
