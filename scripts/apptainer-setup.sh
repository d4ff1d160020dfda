#!/usr/bin/env bash
# Apptainer for the Singularity tests (tests/test_apptainer.py), run by `make test` (make apptainer-setup)
# and .ci/run: Debian sid's apptainer 1.4.5 in a debootstrapped Debian trixie root file system (apptainer
# needs glibc >= 2.38; bookworm's host libc is left alone, and Debian 13 gets the same set-up), entered by
# scripts/apptainer-wrapper.sh, installed as `apptainer` and `singularity` on PATH. Idempotent; needs
# root; prints each step's duration. Why it is done this way: ../shared notes, summarised in docs/hpc.md.
#   APPTAINER_DIR   where the root file system lives (default /var/lib/reprocube-apptainer; outside every
#                   folder the wrapper binds)
#   BIN_DIR         where the wrapper goes (default /usr/local/bin)
set -euo pipefail
cd "$(dirname "$0")/.."
APPTAINER_DIR=${APPTAINER_DIR:-/var/lib/reprocube-apptainer}
ROOTFS=$APPTAINER_DIR/rootfs
BIN_DIR=${BIN_DIR:-/usr/local/bin}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}

step() {
  local name=$1 start=$SECONDS
  shift
  echo "--- $name"
  "$@"
  echo "--- $name: $((SECONDS - start)) s"
}

host_packages() {
  command -v debootstrap >/dev/null && command -v unshare >/dev/null && command -v pivot_root >/dev/null && return
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends debootstrap util-linux \
    || { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends debootstrap util-linux; }
}

root_file_system() {
  [ -x "$ROOTFS/usr/bin/apptainer" ] && return
  # Built beside its final place and moved there when complete: an interrupted set-up starts again.
  local partial=$ROOTFS.partial
  rm -rf "$partial"
  mkdir -p "$APPTAINER_DIR"
  debootstrap --variant=minbase trixie "$partial" "$MIRROR" >/dev/null
  printf 'deb %s trixie main\ndeb %s sid main\n' "$MIRROR" "$MIRROR" > "$partial/etc/apt/sources.list"
  # apptainer is only in sid; everything it depends on comes from trixie. The mirror's sid snapshot can
  # be past its Release file's Valid-Until.
  cat > "$partial/etc/apt/apt.conf.d/90reprocube" <<'END'
APT::Default-Release "trixie";
Acquire::Check-Valid-Until "false";
APT::Install-Recommends "false";
END
  chroot "$partial" apt-get update -q >/dev/null 2>&1
  chroot "$partial" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q apptainer >/dev/null
  chroot "$partial" apt-get clean
  # `build --fakeroot` as root reads the subordinate ids from this file system's files, not the host's.
  echo "root:1000000:65536" > "$partial/etc/subuid"
  echo "root:1000000:65536" > "$partial/etc/subgid"
  mv "$partial" "$ROOTFS"
}

wrapper() {
  local tmp
  tmp=$(mktemp "$BIN_DIR/.apptainer.XXXXXX")
  sed "s|@ROOTFS@|$ROOTFS|" scripts/apptainer-wrapper.sh > "$tmp"
  chmod 755 "$tmp"
  mv "$tmp" "$BIN_DIR/apptainer"
  ln -sfn apptainer "$BIN_DIR/singularity"
}

# Capability names by number (linux/capability.h), for root's bounding set below.
CAPS=(CHOWN DAC_OVERRIDE DAC_READ_SEARCH FOWNER FSETID KILL SETGID SETUID SETPCAP LINUX_IMMUTABLE
  NET_BIND_SERVICE NET_BROADCAST NET_ADMIN NET_RAW IPC_LOCK IPC_OWNER SYS_MODULE SYS_RAWIO SYS_CHROOT
  SYS_PTRACE SYS_PACCT SYS_ADMIN SYS_BOOT SYS_NICE SYS_RESOURCE SYS_TIME SYS_TTY_CONFIG MKNOD LEASE
  AUDIT_WRITE AUDIT_CONTROL SETFCAP MAC_OVERRIDE MAC_ADMIN SYSLOG WAKE_ALARM BLOCK_SUSPEND AUDIT_READ
  PERFMON BPF CHECKPOINT_RESTORE)

capabilities() {
  # apptainer gives root its "full" capability set by default, and fails where a sandbox has dropped one
  # from root's bounding set (CAP_SYS_RESOURCE on some CI machines). Granting root exactly its bounding
  # set (what apptainer knows of it) and using that file works there and is the same as "full" elsewhere.
  local bounding known granted=() number
  bounding=$((16#$(awk '/^CapBnd:/ {print $2}' /proc/self/status)))
  known=$("$BIN_DIR/apptainer" capability avail | sed -n 's/^\(CAP_[A-Z_]*\).*/\1/p')
  for number in "${!CAPS[@]}"; do
    if (((bounding >> number) & 1)) && grep -qx "CAP_${CAPS[number]}" <<< "$known"; then
      granted+=("CAP_${CAPS[number]}")
    fi
  done
  sed -i 's/^root default capabilities = .*/root default capabilities = file/' "$ROOTFS/etc/apptainer/apptainer.conf"
  local output  # one warning per capability ("may escalate privilege"): shown only if the command fails
  output=$("$BIN_DIR/apptainer" capability add --user root "$(IFS=,; echo "${granted[*]}")" 2>&1) || {
    echo "$output" >&2
    return 1
  }
  echo "root: ${#granted[@]} capabilities (root default capabilities = file)"
}

check() {
  "$BIN_DIR/apptainer" --version
  "$BIN_DIR/singularity" --version
}

step "debootstrap, unshare, pivot_root" host_packages
step "root file system $ROOTFS (debootstrap trixie, apptainer from sid)" root_file_system
step "wrapper $BIN_DIR/apptainer and $BIN_DIR/singularity" wrapper
step "root's capabilities for apptainer" capabilities
step "apptainer --version" check
