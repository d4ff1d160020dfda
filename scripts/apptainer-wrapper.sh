#!/usr/bin/env bash
# `apptainer` and `singularity` on a host whose libc is too old for Debian's apptainer (bookworm: 2.36,
# apptainer 1.4.5 from sid needs 2.38). scripts/apptainer-setup.sh installs this file with ROOTFS filled in.
# It runs the real /usr/bin/apptainer of a Debian trixie root file system: in a private mount namespace
# (nothing is left mounted on the host), with the host folders a user works in bound at the same paths,
# after pivot_root (apptainer refuses a chroot: its starter's setns would escape it). Every step execs, so
# the caller's process becomes apptainer's: signals reach the container and its exit status comes back.
# Needs root (mount namespaces, pivot_root). REPROCUBE_APPTAINER_BINDS: more host folders, ':'-separated.
set -euo pipefail
ROOTFS=@ROOTFS@
# The host folders seen at the same paths: where workspaces, checkouts and temporary files live, the
# current folder, and the top folder of every absolute path in the arguments (a SIF, a recipe, a --bind
# source: a checkout under /builds works too). The system folders are the root file system's own.
BINDS=(/home /root /tmp /var/tmp /opt /srv /mnt /media /work /scratch)
SYSTEM="/ /usr /etc /var /bin /sbin /lib /lib32 /lib64 /libx32 /boot /proc /sys /dev /run"

die() {
  echo "$(basename "$0"): error: $*" >&2
  exit 255
}

if [ -z "${REPROCUBE_APPTAINER_ENTERED:-}" ]; then
  [ "$(id -u)" = 0 ] || die "this apptainer (scripts/apptainer-wrapper.sh) needs root: it enters $ROOTFS with a mount namespace and pivot_root"
  [ -x "$ROOTFS/usr/bin/apptainer" ] || die "$ROOTFS/usr/bin/apptainer is missing: run make apptainer-setup"
  # Called by name as `singularity` or `apptainer`: run the real executable of the same name.
  name=$(basename "$0")
  [ "$name" = singularity ] && [ -L "$ROOTFS/usr/bin/singularity" ] || name=apptainer
  REPROCUBE_APPTAINER_ENTERED=$name exec unshare --mount --propagation private -- "$(readlink -f "$0")" "$@"
fi

name=$REPROCUBE_APPTAINER_ENTERED
cwd=$PWD old_cwd=${OLDPWD:-}
unset REPROCUBE_APPTAINER_ENTERED  # apptainer passes the environment on into the container
# apptainer finds each path's mount in /proc/self/mountinfo: the root file system must be a mount itself.
mount --bind "$ROOTFS" "$ROOTFS"
mount -t proc proc "$ROOTFS/proc"
mount --rbind /sys "$ROOTFS/sys"
mount --rbind /dev "$ROOTFS/dev"
IFS=: read -r -a extra <<< "${REPROCUBE_APPTAINER_BINDS:-}"
for arg in "$@"; do
  IFS=, read -r -a specs <<< "${arg#--bind=}"
  for spec in "${specs[@]}"; do
    path=${spec%%:*}
    [[ $path == /* ]] && [ -e "$path" ] || continue
    top=/$(cut -d/ -f2 <<< "$path")
    [[ " $SYSTEM " == *" $top "* ]] || extra+=("$top")
  done
done
bound=()
for dir in "${BINDS[@]}" "$cwd" "${extra[@]}"; do
  [ -n "$dir" ] && [ -d "$dir" ] || continue
  dir=$(readlink -f "$dir")
  for done_dir in "${bound[@]}"; do
    [[ $dir == "$done_dir" || $dir == "$done_dir"/* ]] && continue 2  # inside a folder already bound
  done
  [[ " $SYSTEM " == *" $dir "* ]] && continue
  mkdir -p "$ROOTFS$dir"
  mount --rbind "$dir" "$ROOTFS$dir"
  bound+=("$dir")
done
# `Bootstrap: docker-daemon` builds talk to the host's dockerd.
if [ -S /run/docker.sock ]; then
  touch "$ROOTFS/run/docker.sock"
  mount --bind /run/docker.sock "$ROOTFS/run/docker.sock"
fi
cd "$ROOTFS"
mkdir -p .host
pivot_root . .host
cd "$cwd" 2>/dev/null || cd /
umount -l /.host
# OLDPWD as the caller had it, not the root file system.
if [ -n "$old_cwd" ]; then export OLDPWD=$old_cwd; else unset OLDPWD; fi
# By its full path: a name lookup could find this wrapper again through a bound folder on PATH.
exec "/usr/bin/$name" "$@"
