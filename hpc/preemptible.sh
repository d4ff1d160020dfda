#!/usr/bin/env bash
# Runs one reprocube command inside a SLURM batch job so that the job survives its time limit and
# preemption. The sbatch scripts beside this file exec it, so it *is* the batch shell and receives
# SLURM's warning signal (`#SBATCH --signal=B:USR1@SECONDS`). On that signal it passes SIGUSR1 to
# reprocube (and its children), which checkpoints after the current step and exits 75; then it asks
# SLURM to requeue the job (`scontrol requeue`), and the requeued job continues with resume=auto.
#
#   preemptible.sh COMMAND [KEY=VALUE ...]       e.g. preemptible.sh train framework=jax resume=auto
#
# Environment:
#   REPROCUBE       the reprocube command (default: reprocube on PATH)
#   REPROCUBE_SIF   a Singularity image: run `singularity exec --nv SIF reprocube ...` instead
#   REPROCUBE_NO_REQUEUE=1   stop without requeueing (the checkpoint is kept; resubmit by hand)
set -uo pipefail

log() { echo "reprocube-slurm: $*" >&2; }

if [ $# -lt 1 ]; then
  log "usage: preemptible.sh COMMAND [KEY=VALUE ...]"; exit 2
fi
read -r -a reprocube <<< "${REPROCUBE:-reprocube}"
if [ -n "${REPROCUBE_SIF:-}" ]; then
  if [ ! -f "$REPROCUBE_SIF" ]; then log "REPROCUBE_SIF=$REPROCUBE_SIF: no such image"; exit 2; fi
  if ! command -v singularity >/dev/null; then
    log "singularity: command not found (REPROCUBE_SIF needs Apptainer or Singularity on the node)"; exit 2
  fi
  # A file that does not start (a partial copy, the wrong file) is named here, in one line, before the
  # job's time is spent: a SIF's header alone can look right, so it is started (about a second).
  if ! error=$(singularity exec "$REPROCUBE_SIF" true 2>&1 >/dev/null); then
    log "REPROCUBE_SIF=$REPROCUBE_SIF: singularity cannot start it: $(tail -n 1 <<< "$error")"; exit 2
  fi
  # --nv: the host's NVIDIA driver inside the container; the working directory is bound by default.
  reprocube=(singularity exec --nv "$REPROCUBE_SIF" reprocube)
elif ! command -v "${reprocube[0]}" >/dev/null; then
  log "${reprocube[0]}: command not found (activate reprocube's venv, or set REPROCUBE or REPROCUBE_SIF)"; exit 2
fi

warned=""
child=""
forward() {  # SLURM's warning (USR1) or scancel/preemption (TERM): checkpoint now
  warned=$1
  log "received SIG$1 (job ${SLURM_JOB_ID:-none}, restart ${SLURM_RESTART_COUNT:-0}): asking reprocube to checkpoint"
  [ -n "$child" ] || return 0  # not started yet: the requeue below still follows its exit
  kill -USR1 -- "-$child" 2>/dev/null || kill -USR1 "$child" 2>/dev/null
}
trap 'forward USR1' USR1
trap 'forward TERM' TERM

log "job ${SLURM_JOB_ID:-none} restart ${SLURM_RESTART_COUNT:-0} on $(hostname): ${reprocube[*]} $*"
# Job control gives reprocube its own process group (id = its pid), so that the signal reaches every
# process of it: verify's and study's runs, singularity's child. It starts with USR1 ignored: SLURM's
# warning can come seconds after the start (its timing is coarse), and during Python's start-up it
# would kill the process; reprocube's own handler replaces the ignore once training starts. (Apptainer's
# starter does not pass the ignore on: inside a SIF, reprocube holds USR1 itself from its first line.)
set -m
( trap '' USR1; exec "${reprocube[@]}" "$@" ) &
child=$!
set +m
# wait returns early (status > 128) when a trapped signal arrives: wait again until reprocube is gone,
# repeating the warning every 5 s in case it came before reprocube's handler; then wait once more for
# reprocube's own exit status (bash keeps it).
while kill -0 "$child" 2>/dev/null; do
  wait "$child"
  if [ -n "$warned" ] && kill -0 "$child" 2>/dev/null; then
    sleep 5 & wait $!
    kill -USR1 -- "-$child" 2>/dev/null || true
  fi
done
wait "$child"; status=$?

if [ -n "$warned" ] && [ "$status" -ne 0 ]; then
  if [ -n "${SLURM_JOB_ID:-}" ] && [ -z "${REPROCUBE_NO_REQUEUE:-}" ]; then
    log "reprocube exited $status after SIG$warned: requeueing job $SLURM_JOB_ID"
    if scontrol requeue "$SLURM_JOB_ID"; then
      exit "$status"
    fi
    log "scontrol requeue $SLURM_JOB_ID failed: resubmit this job to continue (its checkpoint is kept)"
  fi
fi
log "reprocube exited $status"
exit "$status"
