"""`reprocube check`: its own room. The conductor (session) runs the command as the runs, stops and restarts
need; what they showed is gathered into one Evidence record (evidence), and the verdict (verdict) is a pure
function of it, an ordered table of named rules. Below them: the options, the run slots (runs, slurm), the
process guard, file activity, the evidence directories, each restart kind (swapped_restart, moved_weights)
and what a stop showed (stop_evidence)."""
