#!/usr/bin/env bash
# Downloads every wheel (and sdist) of a hash-locked requirement file into wheelhouse/VARIANT, so the
# Docker image builds with no network (HPC build nodes often have none). Run it where pip reaches an
# index: the files are checked against the lock's hashes here and again inside the build.
#   scripts/wheelhouse.sh cpu   -> wheelhouse/cpu from requirements-cpu.txt
#   scripts/wheelhouse.sh gpu   -> wheelhouse/gpu from requirements.txt (Python 3.11, manylinux x86_64)
set -euo pipefail
cd "$(dirname "$0")/.."
variant=${1:?usage: scripts/wheelhouse.sh cpu|gpu}
case "$variant" in
  cpu) lock=requirements-cpu.txt ;;
  gpu) lock=requirements.txt ;;
  *) echo "wheelhouse.sh: unknown variant '$variant' (expected cpu or gpu)" >&2; exit 2 ;;
esac
# The image runs Debian bookworm's Python 3.11 on x86_64. pip picks files for the host it runs on, and
# antlr4-python3-runtime (hydra's parser) exists only as an sdist, which rules out --platform: so run this
# on a Linux x86_64 host with Python 3.11.
python=${PYTHON:-python3}
if [ "$("$python" -c 'import platform, sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}-{platform.machine()}")')" != 3.11-x86_64 ]; then
  echo "wheelhouse.sh: needs Python 3.11 on x86_64 (set PYTHON=...), the image's own" >&2; exit 2
fi
# Already complete for this lock: nothing to fetch (pip download would fetch everything again).
stamp="wheelhouse/$variant/.lock-sha256"
lock_sha=$(sha256sum "$lock" | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" = "$lock_sha" ]; then
  echo "wheelhouse/$variant: complete for $lock"
  exit 0
fi
"$python" -m pip download --quiet --disable-pip-version-check --retries 1 --no-deps --require-hashes \
  -r "$lock" -d "wheelhouse/$variant" 2>&1 | { grep -vE "is ignored: it is neither|Retrying \(Retry|^\s*$" >&2 || true; }
echo "$lock_sha" > "$stamp"
echo "wheelhouse/$variant: $(ls "wheelhouse/$variant" | wc -l) files, $(du -sh "wheelhouse/$variant" | cut -f1)"
