#!/usr/bin/env bash
# The Singularity image (SIF) of a Docker image variant, built once per Docker image digest by MLCube's own
# configure step from Singularity.recipe, and checked each time it is reused. Prints the SIF's path.
#   scripts/sif.sh cpu|gpu [IMAGE_DIR]      (IMAGE_DIR default: .image beside mlcube.yaml)
#   SIF_COMPRESSION=zstd   mksquashfs's zstd at level 3 instead of Apptainer's default gzip: the CPU SIF's
#                          build took 240 s instead of 471 s on 2 cores (same size); mounting it needs a kernel
#                          with squashfs zstd (>= 4.14, not RHEL 7's): SIFs for other machines keep gzip.
# The SIF is IMAGE_DIR/reprocube-VERSION-VARIANT-ID.sif, ID the first 12 hex digits of the Docker image's
# id: a rebuilt image gets a new SIF (and the stale ones of the variant are removed), an unchanged one
# reuses it. Beside it, ID.sif.sha256 is written after the build; a reused SIF must still have that
# sha256 and carry the image id in its label org.reprocube.docker-image-id.
# Exit status: 0 done; 2 bad argument, the Docker image or apptainer/singularity or mlcube missing;
# 4 a SIF refused (its sha256 or its image id is not the recorded one); else mlcube's (the build failed).
# Each error is one line on stderr.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
MLCUBE=${MLCUBE:-$REPO/.venv-mlcube/bin/mlcube}

die() {
  echo "sif.sh: error: $2" >&2
  exit "$1"
}

[ $# -ge 1 ] && [ $# -le 2 ] || die 2 "usage: scripts/sif.sh cpu|gpu [IMAGE_DIR]"
variant=$1
case $variant in cpu | gpu) ;; *) die 2 "variant '$variant': expected cpu or gpu" ;; esac
image_dir=${2:-$REPO/.image}
version=$(sed -n 's/^version = "\(.*\)"/\1/p' "$REPO/pyproject.toml")
image=reprocube/reprocube:$version-$variant

command -v docker >/dev/null || die 2 "docker: command not found (the SIF is built from the Docker image $image)"
command -v singularity >/dev/null || die 2 "singularity: command not found (make apptainer-setup installs Apptainer)"
[ -x "$MLCUBE" ] || die 2 "$MLCUBE is missing (make setup installs the MLCube launcher)"
image_id=$(docker image inspect --format '{{.Id}}' "$image" 2>/dev/null) \
  || die 2 "Docker image $image is not built or dockerd does not answer (make container-setup)"
id=${image_id#sha256:}
id=${id:0:12}
name=reprocube-$version-$variant-$id.sif
sif=$image_dir/$name

# One at a time per folder (two test files may ask at once): the second waits, then reuses the first's SIF.
mkdir -p "$image_dir"
exec 9> "$image_dir/.sif.lock"
flock 9

if [ -f "$sif" ]; then
  (cd "$image_dir" && sha256sum --check --status "$name.sha256" 2>/dev/null) \
    || die 4 "$sif: its sha256 is not the one recorded when it was built ($name.sha256): a corrupt or replaced image; remove it to rebuild"
  label=$(singularity inspect --labels "$sif" 2>/dev/null | sed -n 's/^org\.reprocube\.docker-image-id: //p')
  [ "$label" = "$image_id" ] \
    || die 4 "$sif holds Docker image ${label:-(no id recorded)}, not $image ($image_id): remove it to rebuild"
  echo "$sif"
  exit 0
fi

# Stale SIFs of this variant (earlier image digests): several GB each.
find "$image_dir" -maxdepth 1 \( -name "reprocube-$version-$variant-*.sif" -o -name "reprocube-$version-$variant-*.sif.sha256" \) -delete
start=$SECONDS
# No copy of the image's layers in Apptainer's cache (1.1 GB for the CPU image, never used again: each SIF is
# built once per Docker image digest); its temporary files are removed after the build.
export APPTAINER_DISABLE_CACHE=${APPTAINER_DISABLE_CACHE:-true}
# MLCube's configure step runs `singularity build --fakeroot ... IMAGE_DIR/NAME Singularity.recipe` in the
# checkout; the build arguments pick the variant and record the image id (the recipe's %arguments).
build_args="--fakeroot --build-arg VARIANT=$variant --build-arg DOCKER_IMAGE_ID=$image_id"
case ${SIF_COMPRESSION:-gzip} in
  gzip) ;;
  zstd) build_args+=" --mksquashfs-args '-comp zstd -Xcompression-level 3'" ;;
  *) die 2 "SIF_COMPRESSION=$SIF_COMPRESSION: expected gzip or zstd" ;;
esac
"$MLCUBE" configure --mlcube="$REPO" --platform=singularity \
  "-Psingularity.image=$name" "-Psingularity.image_dir=$image_dir" "-Psingularity.build_args=$build_args" >&2 \
  || { status=$?; rm -f "$sif"; die "$status" "mlcube configure failed to build $sif (exit $status)"; }
[ -f "$sif" ] || die 1 "mlcube configure built no $sif"
(cd "$image_dir" && sha256sum "$name" > "$name.sha256")
echo "sif.sh: built $sif in $((SECONDS - start)) s ($(du -h "$sif" | cut -f1))" >&2
echo "$sif"
