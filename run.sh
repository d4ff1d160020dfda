#!/usr/bin/env bash
# The image entrypoint. MLCube calls it as `run.sh TASK --name=/mlcube_ioN/... ...` (one --name=path per
# parameter declared in mlcube.yaml); it maps the task onto the reprocube CLI and execs it, so signals
# reach reprocube directly. Errors: one line on stderr, exit 2.
# Every path is passed as a literal: to argparse in the `--option=PATH` form or after `--` (a path such
# as `--help` is a path, not an option), and to Hydra as a quoted string (hydra_path) in which no
# character of the path is grammar and no `${` is an interpolation.
set -euo pipefail

TASKS="download pytorch tensorflow jax verify compare reproduce report bench study check"

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
      [[ $name =~ ^[a-z_]+$ ]] || die "task $task: unexpected argument '$arg' (expected --name=path)"
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

# escape_before TEXT TOKEN: TEXT with every TOKEN escaped by a backslash, the backslashes just before it
# doubled (so that they stay backslashes); the trailing backslashes are left in $trailing for the caller.
escape_before() {
  local text=$1 token=$2 run="" out=""
  while [ -n "$text" ]; do
    if [ "${text:0:1}" = '\' ]; then
      run+='\'
      text=${text:1}
    elif [ "${text:0:${#token}}" = "$token" ]; then
      out+="$run$run\\$token"
      run=""
      text=${text:${#token}}
    else
      out+="$run${text:0:1}"
      run=""
      text=${text:1}
    fi
  done
  escaped=$out
  trailing=$run
}

# hydra_path PATH: PATH as the value of a Hydra override, a literal string whatever it holds.
# - `${` is escaped for OmegaConf twice: reprocube's load_config resolves the composed config
#   (OmegaConf.resolve), which unescapes once and stores a string that OmegaConf parses again on every
#   read. tests/test_mlcube_safety.py checks the value that reprocube finally reads.
# - then Hydra's single-quoted string: a quote, and the backslashes before it or before the closing
#   quote, are escaped; nothing else is grammar inside the quotes.
hydra_path() {
  local value=$1 _
  for _ in 1 2; do
    escape_before "$value" '${'
    value=$escaped$trailing
  done
  escape_before "$value" "'"
  printf "'%s%s%s'" "$escaped" "$trailing" "$trailing"
}

# nonempty_dir DIR: whether DIR holds any entry (hidden ones included).
nonempty_dir() {
  local entry
  for entry in "$1"/* "$1"/.[!.]* "$1"/..?*; do
    if [ -e "$entry" ] || [ -L "$entry" ]; then
      return 0
    fi
  done
  return 1
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
    if nonempty_dir "${param[source_dir]}"; then
      source=("data.source_dir=$(hydra_path "${param[source_dir]}")")
    fi
    require_file "${param[parameters_file]}"
    exec reprocube download "--config-file=${param[parameters_file]}" -- \
      "data_dir=$(hydra_path "${param[data_dir]}")" "${source[@]}"
    ;;
  pytorch | tensorflow | jax)
    expect parameters_file data_dir runs_dir
    require_file "${param[parameters_file]}"
    exec reprocube train "--config-file=${param[parameters_file]}" -- \
      "framework=$task" "data_dir=$(hydra_path "${param[data_dir]}")" "output_dir=$(hydra_path "${param[runs_dir]}")"
    ;;
  verify)
    expect parameters_file verify_file data_dir runs_dir
    require_file "${param[parameters_file]}"
    require_file "${param[verify_file]}"
    exec reprocube verify "--config-file=${param[parameters_file]}" "--config-file=${param[verify_file]}" -- \
      "data_dir=$(hydra_path "${param[data_dir]}")" "output_dir=$(hydra_path "${param[runs_dir]}")"
    ;;
  bench)
    expect parameters_file data_dir bench_dir
    require_file "${param[parameters_file]}"
    exec reprocube bench "--config-file=${param[parameters_file]}" -- \
      "data_dir=$(hydra_path "${param[data_dir]}")" "bench.out=$(hydra_path "${param[bench_dir]}")"
    ;;
  study)
    expect parameters_file study_file data_dir study_dir
    require_file "${param[parameters_file]}"
    require_file "${param[study_file]}"
    exec reprocube study "--config-file=${param[parameters_file]}" "--config-file=${param[study_file]}" -- \
      "data_dir=$(hydra_path "${param[data_dir]}")" "study.dir=$(hydra_path "${param[study_dir]}")" study.launcher=local
    ;;
  compare)
    expect run_a run_b report_dir
    exec reprocube compare "--out=${param[report_dir]}" -- "${param[run_a]}" "${param[run_b]}"
    ;;
  reproduce)
    expect receipt data_dir report_dir
    [ -f "${param[receipt]}" ] || die "task reproduce: no receipt at ${param[receipt]} (copy the published receipt.json there)"
    exec reprocube reproduce "--out=${param[report_dir]}" --match -- \
      "${param[receipt]}" "data_dir=$(hydra_path "${param[data_dir]}")"
    ;;
  check)
    expect script_dir check_dir
    [ -f "${param[script_dir]}/check.yaml" ] || die "task check: no check.yaml in the script directory ${param[script_dir]} (docs/check.md)"
    exec reprocube check "--script-dir=${param[script_dir]}" "--out=${param[check_dir]}"
    ;;
  report)
    expect runs_dir report_dir
    # Every run directly under runs_dir (a run directory holds config.yaml); verify's runs live one
    # level down and have their own verify.md.
    runs=()
    for config in "${param[runs_dir]}"/*/config.yaml; do
      [ -f "$config" ] && runs+=("${config%/config.yaml}")
    done
    [ ${#runs[@]} -gt 0 ] || die "task report: no runs in ${param[runs_dir]} (run a training task first)"
    exec reprocube report "--out=${param[report_dir]}" -- "${runs[@]}"
    ;;
  *) die "unknown task '$task'; expected one of: $TASKS" ;;
esac
