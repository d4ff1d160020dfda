"""The training: one run's loop, its steps, the replay of one step, the state a run resumes from,
checkpoints and run directories, the framework backends, RNG, preemption and metrics, and the run's
receipt and its signature (which read the run's checkpoints)."""
