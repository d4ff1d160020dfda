#!/usr/bin/env bash
# reprocube's claims checked on this host, one command: restart, resume from an epoch checkpoint and from
# a SIGTERM mid-epoch, verify, bench at batch 32 and 64, determinism off trained twice, the versions of
# the device's stack, and a receipt made on this host's CPU. Results: --out/gpu-check.{json,md}.
#   scripts/gpu-check.sh [--device cuda|cpu] [--out DIR] [--frameworks pytorch,jax] [KEY=VALUE ...]
# Exit 0: every bit-exactness check passed; 1: one failed; 2: bad arguments. See docs/gpu.md.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
python=${PYTHON:-}
if [ -z "$python" ]; then
  if [ -x "$here/../.venv/bin/python" ]; then python="$here/../.venv/bin/python"; else python=python3; fi
fi
exec "$python" "$here/gpu_check.py" "$@"
