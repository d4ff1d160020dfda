#!/usr/bin/env bash
# A lent GPU host (Python 3.12, its own torch/jax stack, no internet) made ready for scripts/gpu-check.sh
# in one command, because GPU time is scarce (docs/gpu.md):
#   scripts/gpu-host.sh bundle [DIR]          here: what the host lacks (py3.12 wheels of hydra-core,
#                                             omegaconf, antlr4, PyYAML, cryptography; Fashion-MNIST's
#                                             .gz files) into DIR (default .gpu-bundle, ignored by git)
#   scripts/gpu-host.sh run DIR FRAMEWORKS BUDGET_S [--verify-cost]
#                                             there: install the bundle and reprocube without touching the
#                                             host's packages, run gpu-check within BUDGET_S seconds, and
#                                             leave results (gpu-check-*.tgz, versions.txt) in $OUT
# With the device tool: run(command="scripts/gpu-host.sh run .gpu-bundle pytorch,jax 540", carry=[".gpu-bundle"]).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)

bundle() {
  local dir=${1:-$repo/.gpu-bundle} python=${PYTHON:-$repo/.venv/bin/python}
  mkdir -p "$dir/wheels" "$dir/fashion_mnist"
  # The versions of requirements-cpu.txt, for the host's Python 3.12.
  local pins=() name
  for name in hydra-core omegaconf pyyaml cryptography cffi pycparser; do
    pins+=("$(grep -io "^$name==[^ ]*" "$repo/requirements-cpu.txt")")
  done
  "$python" -m pip download --quiet --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_34_x86_64 --no-deps -d "$dir/wheels" "${pins[@]}"
  # hydra's parser runtime is an sdist only: built here (pure Python, any 3.x).
  "$python" -m pip wheel --quiet --no-deps -w "$dir/wheels" "$(grep -io '^antlr4-python3-runtime==[^ ]*' "$repo/requirements-cpu.txt")"
  cp /usr/share/datasets/fashion-mnist/*-ubyte.gz "$dir/fashion_mnist/"
  du -sh "$dir"
}

run() {
  local dir frameworks=$2 budget=$3 extra=${4:-}
  dir=$(cd "$1" && pwd)
  local out=${OUT:-/tmp/gpu-host-out} site=/tmp/reprocube-site gc=/tmp/gc
  mkdir -p "$out" "$site"
  python3 -m pip install --quiet --no-index --no-deps --target "$site" "$dir"/wheels/*.whl
  python3 -m pip install --quiet --no-deps --no-build-isolation --target "$site" "$repo" >"$out/install.log" 2>&1 ||
    echo "reprocube not installable here (see install.log): run from src/" >&2
  export PYTHONPATH="$site:$repo/src"
  { nvidia-smi || true; lscpu | grep -E 'Model name|^CPU\(s\)|Flags' || true
    python3 -m pip list 2>/dev/null | grep -iE 'torch|jax|flax|optax|nvidia|numpy|tensorflow' || true; } >"$out/versions.txt"
  # Offline: Debian's .gz files, decompressed and checksummed by reprocube itself.
  python3 -m reprocube download dataset=fashion_mnist data_dir=/tmp/data data.source_dir="$dir/fashion_mnist"
  local status=0
  rm -rf "$gc"
  timeout "$budget" "$repo/scripts/gpu-check.sh" --device cuda --out "$gc" --frameworks "$frameworks" data_dir=/tmp/data || status=$?
  if [ "$extra" = --verify-cost ]; then
    # verify's cost on the host's 16-core CPU: 8 links with 8 jobs against one plain run (bench's own figures).
    timeout 150 python3 -m reprocube bench framework=pytorch device=cpu data_dir=/tmp/data bench.repeats=1 \
      'bench.deterministic=[true]' 'bench.verify_epochs=[8]' verify.jobs=8 bench.out="$gc/verify-cost" >"$gc/verify-cost.log" 2>&1 || true
  fi
  cat "$gc/gpu-check.md" 2>/dev/null || true
  # Large files (checkpoints) stay behind: the device tool brings back only small ones.
  (cd "$gc" && find . -type f -size -900k -print0 | tar --null -T - -czf "$out/gpu-check-${frameworks//,/-}.tgz")
  echo "gpu-check exit $status"
  return "$status"
}

case ${1:-} in
  bundle) shift; bundle "$@" ;;
  run) shift; [ $# -ge 3 ] || { echo "usage: $0 run DIR FRAMEWORKS BUDGET_S [--verify-cost]" >&2; exit 2; }; run "$@" ;;
  *) echo "usage: $0 bundle [DIR] | run DIR FRAMEWORKS BUDGET_S [--verify-cost]" >&2; exit 2 ;;
esac
