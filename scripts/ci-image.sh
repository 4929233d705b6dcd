#!/usr/bin/env bash
# CI: builds the container image from the repository's Dockerfile and runs
# it: one container (non-root, read-only root, models inside, HEALTHCHECK,
# SIGTERM drains and flushes usage), then two replicas behind HAProxy with
# deploy/haproxy.cfg (scripts/ci_image_check.py says what is checked).
#
# Made for this CI machine: Docker Hub is not reachable, so the Debian base
# image is made with debootstrap from the mirror apt uses, and no Rust
# toolchain image is either, so the Dockerfile's `prebuilt` stage takes the
# host's binary and models (ARTIFACTS=prebuilt; users get the compiling
# stage by default). Podman runs with the cgroupfs manager, the
# vfs storage driver, runc, the host network and explicit ulimits: what
# this sandbox allows (crun and raised limits are refused).
#
# Usage: [MODERATO_IMAGE_BINARY=release|debug] scripts/ci-image.sh
#        (root; PostgreSQL and Redis on 127.0.0.1)
set -euo pipefail
cd "$(dirname "$0")/.."
started=$SECONDS

missing=()
for tool in podman:podman runc:runc debootstrap:debootstrap haproxy:haproxy; do
  command -v "${tool%%:*}" >/dev/null 2>&1 || [[ -x "/usr/sbin/${tool%%:*}" ]] || missing+=("${tool#*:}")
done
if ((${#missing[@]})); then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" uidmap
fi
export PATH="$PATH:/usr/sbin"

podman() {
  command podman --cgroup-manager=cgroupfs --storage-driver=vfs --runtime=runc "$@"
}

# A Debian bookworm base image from Debian's packages, trimmed as
# debian:bookworm-slim is (no apt lists or caches, docs, man pages, locales).
BASE_IMAGE=localhost/moderato-base:bookworm
if ! podman image exists "$BASE_IMAGE"; then
  base_started=$SECONDS
  mirror=$(sed -n 's/^URIs: *//p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -n1)
  mirror=${mirror:-http://deb.debian.org/debian}
  rootfs=$(mktemp -d)
  chmod 755 "$rootfs" # it becomes the image's /: mktemp's 0700 would lock the non-root user out
  debootstrap --variant=minbase bookworm "$rootfs" "$mirror" >/dev/null
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*_* \
    "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/* "$rootfs"/usr/share/locale/* \
    "$rootfs"/usr/share/info/*
  tar -C "$rootfs" -c . | podman import --quiet - "$BASE_IMAGE" >/dev/null
  rm -rf "$rootfs"
  echo "base image $BASE_IMAGE made with debootstrap in $((SECONDS - base_started)) s"
fi

# The binary (reuses target/ when present) and the models. Release by
# default, as users build it; MODERATO_IMAGE_BINARY=debug takes the debug
# binary that .ci/run's test build has just made (its dependencies are
# optimised as in release, our own crate is not): what is checked here is
# the container, and a cold release build of every dependency would add ten
# minutes to CI on 2 cores. It is asked for as the test build made it
# (`cargo test --all-targets --no-run`, a no-op after that build): a plain
# `cargo build --bin` resolves the dependencies' features without the
# dev-dependencies', so it compiled every dependency again.
build_started=$SECONDS
case "${MODERATO_IMAGE_BINARY:-release}" in
  release) cargo build --release --locked --bin moderato; binary=target/release/moderato ;;
  debug) cargo test --workspace --all-targets --locked --no-run; binary=target/debug/moderato ;;
  *) echo "MODERATO_IMAGE_BINARY must be release or debug" >&2; exit 2 ;;
esac
scripts/setup.sh >/dev/null
echo "$binary in $((SECONDS - build_started)) s"

IMAGE=localhost/moderato:ci
image_started=$SECONDS
# --layers=false: one commit for the whole stage, not one per instruction
# (each is a full copy of the file system with vfs). --format docker: OCI
# images have no HEALTHCHECK.
# Podman 4.3 commits the image, then fails removing the stage that FROM
# ${ARTIFACTS} names ("identifier is not an image"): the check is that the
# tag, removed first, is there again.
podman rmi --force "$IMAGE" >/dev/null 2>&1 || true
podman build --quiet --layers=false --format docker --network host \
  --build-arg ARTIFACTS=prebuilt \
  --build-arg PREBUILT_BINARY="$binary" \
  --build-arg BUILD_IMAGE="$BASE_IMAGE" \
  --build-arg RUNTIME_IMAGE="$BASE_IMAGE" \
  -t "$IMAGE" . >/dev/null || podman image exists "$IMAGE"
podman image prune --force >/dev/null
size=$(podman image inspect --format '{{.Size}}' "$IMAGE")
echo "image $IMAGE built in $((SECONDS - image_started)) s: $((size / 1000000)) MB"

python3 scripts/ci_image_check.py --image "$IMAGE"
echo "image built and checked in $((SECONDS - started)) s"
