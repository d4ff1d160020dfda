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
# A lease is short (30 minutes of device time, 10 a command), so the work also comes in two halves:
#   scripts/gpu-host.sh checks DIR FRAMEWORKS BUDGET_S [RECEIPTS]
#                                             every framework's bit-exactness checks at once (no timings),
#                                             and each RECEIPTS/FRAMEWORK/receipt.json (another machine's,
#                                             made on a CPU) reproduced on this host's CPU with --match
#   scripts/gpu-host.sh timings DIR FRAMEWORKS BUDGET_S
#                                             then, one at a time on an idle host: bench at batch 32 and 64
#                                             (determinism on and off), verify's cost at 8 links with 8 jobs,
#                                             and `reprocube check` of examples/pytorch_mlp.py on CUDA
#   scripts/gpu-host.sh speed DIR BUDGET_S     issue 58 in one call: on the idle GPU, each framework's epoch at
#                                             batch 64 with its fast form (PyTorch framework.cuda_graph, JAX
#                                             framework.device_loop) and without, two rounds, the bits compared;
#                                             then at once: gpu-check of both (restart, resume, SIGTERM, verify
#                                             with the new defaults) and the trainers' examples checked on CUDA
#                                             beside their truth (scripts/gpu_trainers.py). The data: a generated
#                                             MNIST-shaped set of Fashion-MNIST's size (NO_DATA=1 bundle: the
#                                             real one does not fit beside the repository in what a call carries;
#                                             SKIP_TIMINGS=1 FRAMEWORKS=pytorch: the checks alone, of those named;
#                                             FRAMEWORKS=none TRAINER_ROWS="ROW ...": those trainers' rows alone)
#   scripts/gpu-host.sh jax-cache DIR BUDGET_S
#                                             JAX's compilation cache (on by default) on the GPU: a run that
#                                             compiles into an empty cache, one that loads from it, one with
#                                             it off, at batch 32 and 64 (each run's wall time, the three
#                                             compared bit for bit); `check` of examples/flax_orbax.py there
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
  if [ -n "${NO_DATA:-}" ]; then rmdir "$dir/fashion_mnist"; else cp /usr/share/datasets/fashion-mnist/*-ubyte.gz "$dir/fashion_mnist/"; fi
  du -sh "$dir"
}

setup() {
  local dir=$1 out=${OUT:-/tmp/gpu-host-out} site=/tmp/reprocube-site
  mkdir -p "$out" "$site"
  if [ -n "${TRIAL:-}" ]; then  # this machine's venv has everything
    [ ! -d "$dir/fashion_mnist" ] ||
      python3 -m reprocube download dataset=fashion_mnist data_dir=/tmp/data data.source_dir="$dir/fashion_mnist" >/dev/null
    return
  fi
  python3 -m pip install --quiet --no-index --no-deps --target "$site" "$dir"/wheels/*.whl
  python3 -m pip install --quiet --no-deps --no-build-isolation --target "$site" "$repo" >"$out/install.log" 2>&1 ||
    echo "reprocube not installable here (see install.log): run from src/" >&2
  export PYTHONPATH="$site:$repo/src"
  { nvidia-smi || true; lscpu | grep -E 'Model name|^CPU\(s\)|Flags' || true
    python3 -m pip list 2>/dev/null | grep -iE 'torch|jax|flax|optax|orbax|nvidia|numpy|tensorflow|keras' || true; } >"$out/versions.txt"
  # Offline: Debian's .gz files, decompressed and checksummed by reprocube itself.
  [ ! -d "$dir/fashion_mnist" ] ||
    python3 -m reprocube download dataset=fashion_mnist data_dir=/tmp/data data.source_dir="$dir/fashion_mnist" >/dev/null
}

# A bundle without the data: an MNIST-shaped set of 60000 training and 10000 test images, made here with the
# tests' generator (a bright block where the label says, over noise) and pinned by its sha256, as the tests
# pin theirs. Its overrides (data_dir included), one per line, in $1.
generated_data() {
  python3 - "$1" <<PY
import sys
from pathlib import Path
sys.path.insert(0, "$repo/tests")
from helpers import GeneratedDataset, make_payloads
data = GeneratedDataset(Path("/tmp/data"), make_payloads(train=60000, test=10000))
data.write_raw()
Path(sys.argv[1]).write_text("\n".join(data.overrides()) + "\n")
PY
}

# Result files only (logs, JSON, Markdown), each under 900 KB: the runs' checkpoints stay behind.
pack_results() {
  [ -d "$1" ] || return 0
  (cd "$1" && find . -type f \( -name '*.json' -o -name '*.jsonl' -o -name '*.md' -o -name '*.log' -o -name '*.txt' \) \
    -size -900k -print0 | tar --null -T - -czf "$2")
}

speed() {
  local dir budget=$2 out=${OUT:-/tmp/gpu-host-out} s=/tmp/speed device=${DEVICE:-cuda}
  dir=$(cd "$1" && pwd)
  setup "$dir"
  rm -rf "$s" /tmp/gc-pytorch /tmp/gc-jax /tmp/trainers; mkdir -p "$s"
  generated_data "$s/data-overrides.txt"
  local data=() line
  while IFS= read -r line; do data+=("$line"); done <"$s/data-overrides.txt"
  # 1. The idle GPU, one process at a time: each form's 3 epochs at batch 64, determinism on, two rounds.
  local round form name setting start rounds="1 2"
  [ -z "${SKIP_TIMINGS:-}" ] || rounds=""  # a second call: the checks alone
  for round in $rounds; do
    for form in pytorch:cuda_graph=false pytorch:cuda_graph=true jax:device_loop=false jax:device_loop=true; do
      name=${form%%:*} setting=${form#*:}
      local run="$name-${setting/=/-}-r$round"
      start=$EPOCHREALTIME
      XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 60 python3 -m reprocube train framework="$name" device="$device" epochs=3 \
        batch_size=64 "framework.$setting" "${data[@]}" ${EXTRA:-} output_dir="$s/runs" run_name="$run" log.progress=false \
        >"$s/$run.log" 2>&1 || echo "exit $?" >>"$s/$run.log"
      python3 - "$s/runs/$run/metrics.jsonl" "$run" "$(awk "BEGIN {print $EPOCHREALTIME - $start}")" <<'PY' | tee -a "$s/epochs.jsonl"
import json, sys
path, run, wall = sys.argv[1:]
try:
    epochs = [r for r in map(json.loads, open(path)) if r.get("kind") == "epoch"]
except OSError:
    epochs = []
print(json.dumps({"run": run, "process_wall_s": float(wall), "epoch_wall_s": [r["wall_s"] for r in epochs],
                  "weights_digests": [r["weights_digest"] for r in epochs]}))
PY
    done
  done
  for name in pytorch-cuda_graph jax-device_loop; do
    [ -z "${SKIP_TIMINGS:-}" ] || break
    local pair
    for pair in "false-r1 true-r1" "false-r1 false-r2" "true-r1 true-r2"; do
      set -- $pair
      python3 -m reprocube compare "$s/runs/$name-$1" "$s/runs/$name-$2" --out "$s/compare-$name-$1-$2" \
        >"$s/compare-$name-$1-$2.log" 2>&1; echo "compare $name $1 $2 exit $?" | tee -a "$s/compare.txt"
    done
  done
  rm -rf "$s"/runs/*/checkpoints
  # 2. At once: both frameworks' bit-exactness checks with the new defaults, and the trainers' examples.
  local pids=() status=0
  for name in ${FRAMEWORKS:-pytorch jax}; do
    [ "$name" != none ] || continue  # FRAMEWORKS=none: the trainers alone
    XLA_PYTHON_CLIENT_PREALLOCATE=false timeout "$budget" "$repo/scripts/gpu-check.sh" --device "$device" --no-bench \
      --out "/tmp/gc-$name" --frameworks "$name" "${data[@]}" ${EXTRA:-} >"$out/checks-$name.log" 2>&1 &
    pids+=($!)
  done
  if [ -z "${SKIP_TRAINERS:-}" ]; then
    (cd /tmp && timeout "$budget" python3 "$repo/scripts/gpu_trainers.py" /tmp/trainers ${TRAINER_ROWS:-} >"$s/trainers.log" 2>&1) &
    pids+=($!)
  fi
  for name in "${pids[@]}"; do wait "$name" || status=1; done
  cat "$s/trainers.log" 2>/dev/null || true
  tail -14 /tmp/gc-pytorch/gpu-check.md /tmp/gc-jax/gpu-check.md 2>/dev/null || true
  pack_results "$s" "$out/speed.tgz"
  pack_results /tmp/trainers "$out/trainers.tgz"
  for name in pytorch jax; do pack_results "/tmp/gc-$name" "$out/gpu-check-$name.tgz"; done
  echo "speed exit $status"
  return "$status"
}

# Small result files only (checkpoints stay behind: the device tool brings back at most 8 files).
pack() { (cd "$1" && find . -type f -size -900k -print0 | tar --null -T - -czf "$2"); }

checks() {
  local dir frameworks=$2 budget=$3 receipts=${4:-} out=${OUT:-/tmp/gpu-host-out} name
  dir=$(cd "$1" && pwd)
  setup "$dir"
  local pids=()
  for name in ${frameworks//,/ }; do
    # JAX would take 75% of the GPU's memory at start; the frameworks share the GPU here.
    XLA_PYTHON_CLIENT_PREALLOCATE=false timeout "$budget" "$repo/scripts/gpu-check.sh" --device cuda --no-bench \
      --out "/tmp/gc-$name" --frameworks "$name" data_dir=/tmp/data >"$out/checks-$name.log" 2>&1 &
    pids+=($!)
  done
  if [ -n "$receipts" ]; then
    for name in ${frameworks//,/ }; do
      [ -f "$receipts/$name/receipt.json" ] || continue
      timeout "$budget" python3 -m reprocube reproduce "$receipts/$name/receipt.json" --match --out "/tmp/xm/$name" \
        --public-key "$receipts/signing-key.pub" device=cpu data_dir=/tmp/data >"/tmp/xm-$name.log" 2>&1 &
      pids+=($!)
    done
  fi
  local status=0 pid
  for pid in "${pids[@]}"; do wait "$pid" || status=1; done
  mkdir -p /tmp/xm && cp /tmp/xm-*.log /tmp/xm/ 2>/dev/null || true
  for name in ${frameworks//,/ }; do
    cat "/tmp/gc-$name/gpu-check.md" 2>/dev/null || true
    pack "/tmp/gc-$name" "$out/gpu-check-$name.tgz"
  done
  pack /tmp/xm "$out/cross-machine.tgz"
  echo "checks exit $status"
  return "$status"
}

timings() {
  local dir frameworks=$2 budget=$3 out=${OUT:-/tmp/gpu-host-out} gc=/tmp/gc-timings status=0
  dir=$(cd "$1" && pwd)
  setup "$dir"
  rm -rf "$gc"
  timeout "$budget" "$repo/scripts/gpu-check.sh" --device cuda --bench-only --out "$gc" --frameworks "$frameworks" \
    data_dir=/tmp/data >"$out/timings.log" 2>&1 || status=$?
  timeout 150 python3 -m reprocube bench framework=pytorch device=cpu data_dir=/tmp/data bench.repeats=1 \
    'bench.deterministic=[true]' 'bench.verify_epochs=[8]' verify.jobs=8 bench.out="$gc/verify-cost" >"$gc/verify-cost.log" 2>&1 || true
  # A script that is not ours, on CUDA: resumes exactly with its generators saved (CPU and CUDA).
  (cd /tmp && timeout 240 python3 -m reprocube check --out "$gc/check-pytorch-mlp" --output model.pt --output metrics.csv --at-line saved \
    --copy "$repo/examples/pytorch_mlp.py" --seed-env SEED -- python3 pytorch_mlp.py --save-rng --device cuda \
    >"$gc/check-pytorch-mlp.log" 2>&1; echo "check exit $?" >>"$gc/check-pytorch-mlp.log") || true
  cat "$gc/gpu-check.md" "$gc/check-pytorch-mlp.log" 2>/dev/null | tail -60 || true
  pack "$gc" "$out/gpu-timings.tgz"
  echo "timings exit $status"
  return "$status"
}

# What a first lease left open (2026-11-25): verify's cost on the host's CPU on a fifth of Fashion-MNIST (the
# whole set took past 150 s), and what reproduce --match says of a B trained without the determinism flags.
findings() {
  local dir frameworks=$2 budget=$3 only=${4:-} out=${OUT:-/tmp/gpu-host-out} f=/tmp/findings name
  dir=$(cd "$1" && pwd)
  setup "$dir"
  mkdir -p "$f"
  [ "$only" = --replay-only ] || timeout "$budget" python3 -m reprocube bench framework=pytorch device=cpu data_dir=/tmp/data data.train_limit=12000 \
    bench.repeats=1 'bench.deterministic=[true]' 'bench.verify_epochs=[8]' verify.jobs=8 bench.out="$f/verify-cost" \
    >"$f/verify-cost.log" 2>&1 || echo "verify-cost exit $?" >>"$f/verify-cost.log"
  local pids=()
  for name in ${frameworks//,/ }; do
    ( XLA_PYTHON_CLIENT_PREALLOCATE=false
      export XLA_PYTHON_CLIENT_PREALLOCATE
      python3 -m reprocube train framework="$name" device=cuda epochs=1 data_dir=/tmp/data output_dir="$f/runs" \
        run_name="$name" log.progress=false >"$f/$name-train.log" 2>&1 &&
      timeout "$budget" python3 -m reprocube reproduce "$f/runs/$name" --match --allow-config-change --out "$f/$name-off" \
        deterministic=false data_dir=/tmp/data >"$f/$name-reproduce-off.log" 2>&1
      echo "exit $?" >>"$f/$name-reproduce-off.log" ) &
    pids+=($!)
  done
  wait "${pids[@]}" || true
  grep -hE "^(verdict|\[pytorch\])|first (differing|non-deterministic) operation|exit" "$f"/*.log | tail -20 || true
  pack "$f" "$out/gpu-findings.tgz"
}

# The host's CPU as another machine for one framework (JAX's first try trained on the GPU: device=cpu was
# not honoured, fixed in frameworks/jax.py): a receipt made there, and RECEIPTS/FRAMEWORK reproduced there.
cpu_machine() {
  local dir framework=$2 budget=$3 receipts=$4 out=${OUT:-/tmp/gpu-host-out} c=/tmp/cpu-machine
  dir=$(cd "$1" && pwd)
  setup "$dir"
  mkdir -p "$c"
  timeout "$budget" python3 -m reprocube train framework="$framework" device=cpu epochs=2 data_dir=/tmp/data \
    output_dir="$c/runs" run_name=cpu log.progress=false >"$c/train.log" 2>&1 &
  local train=$!
  timeout "$budget" python3 -m reprocube reproduce "$receipts/$framework/receipt.json" --match --out "$c/reproduce" \
    --public-key "$receipts/signing-key.pub" device=cpu data_dir=/tmp/data >"$c/reproduce.log" 2>&1 || true
  wait "$train" || echo "train exit $?" >>"$c/train.log"
  cp "$c/runs/cpu/receipt.json" "$c/receipt.json" 2>/dev/null || true
  grep -hE "^(verdict|written)|exit" "$c"/*.log || true
  pack "$c" "$out/cpu-machine-$framework.tgz"
}

# TRIAL=1 DEVICE=cpu EXTRA=data.train_limit=640 PATH=.venv/bin:$PATH: the same on this CPU, with this venv
# (a trial of the script before a lease).
jax_cache() {
  local dir budget=$2 out=${OUT:-/tmp/gpu-host-out} j=/tmp/jax-cache-check batch name setting start
  dir=$(cd "$1" && pwd)
  setup "$dir"
  rm -rf "$j"; mkdir -p "$j"
  for batch in 64 32; do
    for name in cold warm off; do
      setting=$j/cache-$batch; [ "$name" = off ] && setting=off
      start=$EPOCHREALTIME
      REPROCUBE_JAX_CACHE=$setting JAX_LOG_COMPILES=1 timeout "$budget" python3 -m reprocube train framework=jax \
        device="${DEVICE:-cuda}" epochs=2 batch_size=$batch data_dir=/tmp/data ${EXTRA:-} output_dir="$j/runs" run_name="b$batch-$name" \
        log.progress=false >"$j/b$batch-$name.log" 2>&1 || echo "exit $?" >>"$j/b$batch-$name.log"
      echo "{\"batch\": $batch, \"run\": \"$name\", \"wall_s\": $(awk "BEGIN {print $EPOCHREALTIME - $start}"), \"cache_hits\": $(grep -c 'compilation cache hit' "$j/b$batch-$name.log")}" | tee -a "$j/wall.jsonl"
    done
    for name in warm off; do
      python3 -m reprocube compare "$j/runs/b$batch-cold" "$j/runs/b$batch-$name" --out "$j/compare-b$batch-$name" \
        >"$j/compare-b$batch-$name.log" 2>&1; echo "compare b$batch cold/$name exit $?" | tee -a "$j/wall.jsonl"
    done
  done
  # A script that is not ours on the GPU: Flax, Optax and an Orbax CheckpointManager, stopped twice.
  (cd /tmp && XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 240 python3 -m reprocube check --out "$j/check-flax-orbax" \
    --output final --output metrics.csv --at-line saved --copy "$repo/examples/flax_orbax.py" --seed-env SEED \
    -- python3 flax_orbax.py >"$j/check-flax-orbax.log" 2>&1; echo "check exit $?" >>"$j/check-flax-orbax.log") || true
  tail -5 "$j/check-flax-orbax.log"
  rm -rf "$j"/cache-* "$j"/runs/*/checkpoints
  pack "$j" "$out/gpu-jax-cache.tgz"
}

# What changed since the last lease (2026-11-26): PyTorch's channels_last and JAX's conv2-as-matmul
# defaults (issue 40). Both frameworks' six checks with the new defaults on CUDA, beside them the CUDA
# optimizer test and the added-key tests (device=auto: CUDA here), then on an idle host each default's
# epoch time against the form it replaced (bench, determinism on, one process each).
defaults() {
  local dir frameworks=$2 budget=$3 out=${OUT:-/tmp/gpu-host-out} d=/tmp/defaults name pids=() status=0
  dir=$(cd "$1" && pwd)
  setup "$dir"
  rm -rf "$d"; mkdir -p "$d"
  [ -n "${TRIAL:-}" ] || python3 -m pip install --quiet --no-index --no-deps --target /tmp/reprocube-site "$dir"/test-wheels/*.whl
  for name in ${frameworks//,/ }; do
    XLA_PYTHON_CLIENT_PREALLOCATE=false timeout "$budget" "$repo/scripts/gpu-check.sh" --device "${DEVICE:-cuda}" --no-bench \
      --out "/tmp/gc-$name" --frameworks "$name" data_dir=/tmp/data ${EXTRA:-} >"$out/checks-$name.log" 2>&1 &
    pids+=($!)
  done
  # Its exit status joins the checks' (a failed test fails the call); set -e must not skip the log's last line.
  (cd "$repo" || exit; rc=0; XLA_PYTHON_CLIENT_PREALLOCATE=false timeout "$budget" python3 -m pytest -q -p no:cacheprovider \
    tests/test_torch_sgd.py tests/test_added_result_keys.py >"$d/pytest.log" 2>&1 || rc=$?; echo "pytest exit $rc" >>"$d/pytest.log"; exit "$rc") &
  pids+=($!)
  for name in "${pids[@]}"; do wait "$name" || status=1; done
  tail -3 "$d/pytest.log"
  local form setting
  for form in pytorch:memory_format=channels_last pytorch:memory_format=contiguous jax:conv2=matmul jax:conv2=convolution; do
    name=${form%%:*} setting=${form#*:}
    [[ ",$frameworks," == *",$name,"* ]] || continue
    local b="$d/bench-$name-${setting#*=}"
    timeout "${BENCH_BUDGET:-50}" python3 -m reprocube bench framework="$name" device="${DEVICE:-cuda}" data_dir=/tmp/data ${EXTRA:-} \
      "framework.$setting" bench.repeats=1 'bench.deterministic=[true]' 'bench.verify_epochs=[]' \
      bench.out="$b" >"$b.log" 2>&1 || echo "bench exit $?" >>"$b.log"
    echo "$setting"; grep -hE "epoch|exit" "$b.log" | tail -3 || true
  done
  for name in ${frameworks//,/ }; do
    tail -12 "/tmp/gc-$name/gpu-check.md" 2>/dev/null || true
    pack "/tmp/gc-$name" "$out/gpu-check-$name.tgz"
  done
  pack "$d" "$out/defaults.tgz"
  echo "defaults exit $status"
  return "$status"
}

run() {
  local dir frameworks=$2 budget=$3 extra=${4:-}
  dir=$(cd "$1" && pwd)
  local out=${OUT:-/tmp/gpu-host-out} gc=/tmp/gc
  setup "$dir"
  local status=0
  rm -rf "$gc"
  timeout "$budget" "$repo/scripts/gpu-check.sh" --device cuda --out "$gc" --frameworks "$frameworks" data_dir=/tmp/data || status=$?
  if [ "$extra" = --verify-cost ]; then
    # verify's cost on the host's 16-core CPU: 8 links with 8 jobs against one plain run (bench's own figures).
    timeout 150 python3 -m reprocube bench framework=pytorch device=cpu data_dir=/tmp/data bench.repeats=1 \
      'bench.deterministic=[true]' 'bench.verify_epochs=[8]' verify.jobs=8 bench.out="$gc/verify-cost" >"$gc/verify-cost.log" 2>&1 || true
  fi
  cat "$gc/gpu-check.md" 2>/dev/null || true
  pack "$gc" "$out/gpu-check-${frameworks//,/-}.tgz"
  echo "gpu-check exit $status"
  return "$status"
}

case ${1:-} in
  bundle) shift; bundle "$@" ;;
  run) shift; [ $# -ge 3 ] || { echo "usage: $0 run DIR FRAMEWORKS BUDGET_S [--verify-cost]" >&2; exit 2; }; run "$@" ;;
  checks) shift; [ $# -ge 3 ] || { echo "usage: $0 checks DIR FRAMEWORKS BUDGET_S [RECEIPTS]" >&2; exit 2; }; checks "$@" ;;
  findings) shift; [ $# -ge 3 ] || { echo "usage: $0 findings DIR FRAMEWORKS BUDGET_S [--replay-only]" >&2; exit 2; }; findings "$@" ;;
  cpu-machine) shift; [ $# -eq 4 ] || { echo "usage: $0 cpu-machine DIR FRAMEWORK BUDGET_S RECEIPTS" >&2; exit 2; }; cpu_machine "$@" ;;
  speed) shift; [ $# -eq 2 ] || { echo "usage: $0 speed DIR BUDGET_S" >&2; exit 2; }; speed "$@" ;;
  jax-cache) shift; [ $# -eq 2 ] || { echo "usage: $0 jax-cache DIR BUDGET_S" >&2; exit 2; }; jax_cache "$@" ;;
  defaults) shift; [ $# -eq 3 ] || { echo "usage: $0 defaults DIR FRAMEWORKS BUDGET_S" >&2; exit 2; }; defaults "$@" ;;
  timings) shift; [ $# -eq 3 ] || { echo "usage: $0 timings DIR FRAMEWORKS BUDGET_S" >&2; exit 2; }; timings "$@" ;;
  *) echo "usage: $0 bundle [DIR] | run|checks|timings DIR FRAMEWORKS BUDGET_S ..." >&2; exit 2 ;;
esac
