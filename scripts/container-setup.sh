#!/usr/bin/env bash
# Set-up for the container tests (tests/test_container.py), run by `make test` and .ci/run: Docker and
# python3 (for the unprivileged test user's launcher venv) from Debian, a local bookworm base image (no registry is reachable here: debootstrap + docker import), the CPU wheelhouse and
# the CPU image, built once. Idempotent; needs root; prints each step's duration.
set -euo pipefail
cd "$(dirname "$0")/.."
BASE_IMAGE=reprocube-base:bookworm
VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
IMAGE=reprocube/reprocube:$VERSION-cpu

step() {
  local name=$1 start=$SECONDS
  shift
  echo "--- $name"
  "$@"
  echo "--- $name: $((SECONDS - start)) s"
}

install_packages() {
  command -v dockerd >/dev/null && command -v debootstrap >/dev/null && [ -x /usr/bin/python3 ] && return
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends docker.io debootstrap python3 \
    || { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends docker.io debootstrap python3; }
}

start_dockerd() {
  docker info >/dev/null 2>&1 && return
  setsid nohup dockerd >/var/log/reprocube-dockerd.log 2>&1 &
  for _ in $(seq 60); do
    docker info >/dev/null 2>&1 && return
    sleep 0.5
  done
  echo "container-setup: dockerd did not start; see /var/log/reprocube-dockerd.log" >&2
  tail -n 5 /var/log/reprocube-dockerd.log >&2
  exit 1
}

base_image() {
  docker image inspect "$BASE_IMAGE" >/dev/null 2>&1 && return
  local root
  root=$(mktemp -d)
  debootstrap --variant=minbase bookworm "$root" http://deb.debian.org/debian >/dev/null
  tar -C "$root" -c . | docker import - "$BASE_IMAGE" >/dev/null
  rm -rf "$root"
}

build_image() {
  # The build stage's intermediate images stay: they are the cache that makes a rebuild take seconds.
  # The image this build replaces under our tag is removed (3.5 GB each: repeated rebuilds filled the disk).
  local previous
  previous=$(docker image inspect --format '{{.Id}}' "$IMAGE" 2>/dev/null || true)
  docker build --quiet --build-arg BASE_IMAGE="$BASE_IMAGE" --build-arg VARIANT=cpu -t "$IMAGE" . >/dev/null
  if [ -n "$previous" ] && [ "$previous" != "$(docker image inspect --format '{{.Id}}' "$IMAGE")" ]; then
    docker image rm "$previous" >/dev/null 2>&1 || true  # still used by a container: left in place
  fi
  docker image ls "$IMAGE"
}

step "docker.io, debootstrap, python3" install_packages
step "dockerd" start_dockerd
step "base image $BASE_IMAGE (debootstrap)" base_image
step "wheelhouse/cpu (offline build input)" scripts/wheelhouse.sh cpu
step "image $IMAGE" build_image
