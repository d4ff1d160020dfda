#!/usr/bin/env bash
# The image entrypoint. MLCube calls it as `run.sh TASK --name=/mlcube_ioN/... ...` (one --name=path per
# parameter declared in mlcube.yaml); it maps the task onto the reprocube CLI and execs it, so signals
# reach reprocube directly. Errors: one line on stderr, exit 2.
set -euo pipefail

TASKS="download pytorch tensorflow jax verify compare report bench study"

die() {
  echo "run.sh: error: $*" >&2
  exit 2
}

[ $# -ge 1 ] || die "no task given; expected one of: $TASKS"
task=$1
shift

declare -A param=()
for arg in "$@"; do
  case "$arg" in
    --?*=?*)
      name=${arg%%=*}
      name=${name#--}
      [ -z "${param[$name]:-}" ] || die "task $task: parameter --$name given twice"
      param[$name]=${arg#*=}
      ;;
    *) die "task $task: unexpected argument '$arg' (expected --name=path)" ;;
  esac
done

# Every parameter the task declares must be there, and nothing else.
expect() {
  local name
  for name in "${!param[@]}"; do
    [[ " $* " == *" $name "* ]] || die "task $task: unknown parameter --$name (this task takes: $*)"
  done
  for name in "$@"; do
    [ -n "${param[$name]:-}" ] || die "task $task: missing parameter --$name"
  done
}

# A parameters file (workspace/train.yaml) is optional content but, when named, must exist: a typo must
# not silently train with the defaults.
require_file() {
  [ -f "$1" ] || die "task $task: parameters file $1 not found (check the parameters_file/verify_file/study_file parameter)"
}

case "$task" in
  download)
    expect parameters_file source_dir data_dir
    # IDX files placed in workspace/source are imported offline; an empty directory means: download.
    source=()
    if [ -n "$(find "${param[source_dir]}" -mindepth 1 -maxdepth 1 -print -quit)" ]; then
      source=("data.source_dir=${param[source_dir]}")
    fi
    require_file "${param[parameters_file]}"
    exec reprocube download --config-file "${param[parameters_file]}" \
      "data_dir=${param[data_dir]}" "${source[@]}"
    ;;
  pytorch | tensorflow | jax)
    expect parameters_file data_dir runs_dir
    require_file "${param[parameters_file]}"
    exec reprocube train --config-file "${param[parameters_file]}" \
      "framework=$task" "data_dir=${param[data_dir]}" "output_dir=${param[runs_dir]}"
    ;;
  verify)
    expect parameters_file verify_file data_dir runs_dir
    require_file "${param[parameters_file]}"
    require_file "${param[verify_file]}"
    exec reprocube verify --config-file "${param[parameters_file]}" --config-file "${param[verify_file]}" \
      "data_dir=${param[data_dir]}" "output_dir=${param[runs_dir]}"
    ;;
  bench)
    expect parameters_file data_dir bench_dir
    require_file "${param[parameters_file]}"
    exec reprocube bench --config-file "${param[parameters_file]}" "data_dir=${param[data_dir]}" "bench.out=${param[bench_dir]}"
    ;;
  study)
    expect parameters_file study_file data_dir study_dir
    require_file "${param[parameters_file]}"
    require_file "${param[study_file]}"
    exec reprocube study --config-file "${param[parameters_file]}" --config-file "${param[study_file]}" \
      "data_dir=${param[data_dir]}" "study.dir=${param[study_dir]}" study.launcher=local
    ;;
  compare)
    expect run_a run_b report_dir
    exec reprocube compare "${param[run_a]}" "${param[run_b]}" --out "${param[report_dir]}"
    ;;
  report)
    expect runs_dir report_dir
    # Every run directly under runs_dir (a run directory holds config.yaml); verify's runs live one
    # level down and have their own verify.md.
    runs=()
    for config in "${param[runs_dir]}"/*/config.yaml; do
      [ -f "$config" ] && runs+=("$(dirname "$config")")
    done
    [ ${#runs[@]} -gt 0 ] || die "task report: no runs in ${param[runs_dir]} (run a training task first)"
    exec reprocube report "${runs[@]}" --out "${param[report_dir]}"
    ;;
  *) die "unknown task '$task'; expected one of: $TASKS" ;;
esac
