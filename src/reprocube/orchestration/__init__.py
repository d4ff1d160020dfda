"""What runs other processes: the one child-process launcher (children die with their parent), Hydra
multirun launchers (local or SLURM), the Hydra job apps of study and verify, bench's measurement
process, and a config command's invocation. Above the engine, below the commands."""
