#!/usr/bin/env bash
# Regenerates the hash-locked requirement files from requirements*.in with uv.
# torch's CPU wheel comes from the PyTorch CPU index (download.pytorch.org/whl/cpu) or, where pip is
# configured with it, a local wheel directory holding the same file (WHEEL_DIR, default: pip's find-links).
set -euo pipefail
cd "$(dirname "$0")/.."
wheel_dir=${WHEEL_DIR:-$(pip config get global.find-links 2>/dev/null || true)}
find_links=()
[ -n "$wheel_dir" ] && find_links=(--find-links "$wheel_dir")
header='# Hash-locked; regenerate with scripts/lock.sh. The torch CPU wheel comes from the PyTorch CPU index.
--extra-index-url https://download.pytorch.org/whl/cpu'

compile() {  # compile IN OUT [extra uv args]
  local in=$1 out=$2; shift 2
  uv pip compile --quiet --python-version 3.11 --generate-hashes --no-header \
    --index-url https://pypi.org/simple "${find_links[@]}" "$@" "$in" -o "$out.tmp"
}

compile requirements-cpu.in requirements-cpu.txt
# The GPU image's lock: PyPI only (the local wheel directory holds the CPU torch), for the image's
# platform whatever this host is: Debian bookworm, glibc 2.36, x86_64.
uv pip compile --quiet --python-version 3.11 --python-platform x86_64-manylinux_2_36 --generate-hashes --no-header \
  --index-url https://pypi.org/simple requirements.in -o requirements.txt.tmp
# The test lock holds only what tests add, constrained to the runtime lock so both install together.
runtime_pkgs=$(grep -oE '^[a-z0-9_.-]+==' requirements-cpu.txt.tmp | tr -d '=' | sed 's/^/--no-emit-package /' | tr '\n' ' ')
# shellcheck disable=SC2086
compile requirements-test.in requirements-test.txt -c requirements-cpu.txt.tmp $runtime_pkgs
# The trainers (make test only), constrained to both and emitting neither's packages.
test_pkgs=$(grep -oE '^[a-z0-9_.-]+==' requirements-test.txt.tmp | tr -d '=' | sed 's/^/--no-emit-package /' | tr '\n' ' ')
# shellcheck disable=SC2086
compile requirements-trainers.in requirements-trainers.txt -c requirements-cpu.txt.tmp -c requirements-test.txt.tmp $runtime_pkgs $test_pkgs
{ echo "$header"; cat requirements-cpu.txt.tmp; } > requirements-cpu.txt
{ echo "# Hash-locked test-only additions to requirements-cpu.txt; regenerate with scripts/lock.sh."; cat requirements-test.txt.tmp; } > requirements-test.txt
{ echo "# Hash-locked trainers (requirements-trainers.in) beside requirements-cpu.txt and requirements-test.txt; regenerate with scripts/lock.sh."; cat requirements-trainers.txt.tmp; } > requirements-trainers.txt
compile requirements-mlcube.in requirements-mlcube.txt
{ echo "# Hash-locked MLCube launcher (requirements-mlcube.in); regenerate with scripts/lock.sh."; cat requirements-mlcube.txt.tmp; } > requirements-mlcube.txt
{ echo "# Hash-locked lock of the GPU image (requirements.in); regenerate with scripts/lock.sh."; cat requirements.txt.tmp; } > requirements.txt
rm -f requirements*.txt.tmp
