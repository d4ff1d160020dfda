"""The words of `reprocube check`'s verdicts, as named templates: each rule of check.verdict's table says its
verdict with one of these (filled with what the evidence names), and a pass's not-checked lines are here
too. Apart from the rules so that the table reads as rules; every name is used there."""

SUSPECTS = (
    "unseeded generators (Python's random, NumPy, the framework's: torch.manual_seed, tf.random.set_seed, a JAX "
    "key), seeds from the clock or os.urandom, PYTHONHASHSEED (the order of a set or of unordered iteration), "
    "non-deterministic kernels and thread counts "
    "(torch.use_deterministic_algorithms, TF_DETERMINISTIC_OPS, XLA flags, cuDNN/oneDNN autotuning), data-loader "
    "workers, and timestamps or absolute paths written into the outputs (--ignore them)"
)
LINKED_OUTPUT = (
    "{linked} is a symbolic link: the declared outputs under it are never read through it (each run's would be "
    "one file elsewhere): declare files the run writes in its work directory"
)
REMOVED_OUTPUT = (
    "clean-1 wrote the declared output {output}, and it was then removed or replaced by another process "
    "(another run's command, beside it?) before check compared it; resume was not tested"
)
UNWRITTEN = "it did not write the declared output {output}{nor}: a typo in --output, or the script writes it elsewhere"
UNCOMPARABLE = (
    "none of its declared outputs could be compared with clean-1's (links, which are never followed, special "
    "files, one file shared by the runs, or too large: see not checked): declare the files the training writes "
    "in its work directory"
)
OWN_VALUE = (
    "two uninterrupted runs differ ({where}), and only in {value}, which check gives each run a fresh one of: "
    "the script records where it ran, not what it trained. Leave it out of the outputs, or --ignore FILE:KEY "
    "it; resume was not tested"
)
SHARED_ELSEWHERE = (
    "two uninterrupted runs that ran at once differ ({where}), and they saved no checkpoint in their own "
    "directories (work, HOME, TMPDIR): they may have shared one kept elsewhere, so this does not show the "
    "script non-deterministic, and resume cannot be tested without a checkpoint check sees. Run with --jobs 1 to "
    "tell the two apart"
)
NOT_DETERMINISTIC = "two uninterrupted runs differ ({where}); resume was not tested. Usual suspects: {suspects}"
CHANGED_AFTER = (
    "{run}'s outputs changed after it ended ({changed}): another run changed them{how}, so nothing can be "
    "compared with them; resume was not judged"
)
CONTROL_SAME = "a run with another seed wrote the same outputs: "
CONTROL_VOID = "they do not depend on the training, so their agreement proves nothing"
NO_STOP_LANDED = (
    "the command finished before its first stop: resume was not tested (stop earlier: --at SECONDS, --at-file "
    "GLOB or --at-line REGEX)"
)
BEFORE_STOPS = (
    "the stopped run departs from the uninterrupted one before its first stop ({where}): not resume's doing; "
    "{agreeing}. Usual suspects: {suspects}"
)
AGREEING = "{runs} do not exclude a rarer non-determinism (--repeat N)"
QUICK_ONE = "--quick made one uninterrupted run (without it, two must agree before any stop)"
PER_PROCESS = (
    "the stopped run differs from the uninterrupted one, and so does one of {runs} started to tell the two "
    "apart ({where}): the script is not deterministic from one process to the next (a set's order under hash "
    "randomisation, PYTHONHASHSEED; a seed from the process), not resume's doing; resume was not judged. "
    "Usual suspects: " + SUSPECTS
)
NOTHING_TIES = (
    "{restarts}: {named}. The outputs differ ({found}), but no restart was shown to resume, so nothing ties "
    "that to a resume: a restart that began again over what an earlier attempt left, or state outside the run's "
    "directories (another run's)"
)
TRAINER_SAID = "The trainer said why itself: {said}"
SAVE_SURVIVED = "{where}, and the run still resumed exactly: it survives a preemption during that save"
SAVE_INTERRUPTED = (
    "{where}, and the restart then failed ({failed}): a preemption while the script writes a checkpoint may "
    "leave a run that cannot resume (write it elsewhere and rename it into place once whole, or have the "
    "restart skip an incomplete one); if its restart fails after a stop between saves too (--at-line on a line "
    "printed after a save), the failure is not the partial checkpoint's"
)
RARER = "Two agreeing uninterrupted runs do not exclude a rarer non-determinism: --repeat N tells them apart"
RARER_CHECKED = (
    "More uninterrupted runs, started because it differs, agreed with the first{through}: not a non-determinism of "
    "the process"
)
VOID_STOPS = (
    "{restarts}: {named}. The same outputs show only that the script is deterministic: resume was not tested there"
)
SWAP = (
    "a restart given another seed's state (what the control left {when}, in a fresh directory, under this run's "
    "names) wrote the uninterrupted run's {files} bit for bit, so it did not continue from the state it found "
    "(it starts again, perhaps retraining what it had saved, or it refuses another run's checkpoint); the "
    "restarts above may have done the same (logs/swapped.log)"
)
SWAP_NOT_SHOWN = "whether a restart continues from the state it reads (a restart given another seed's state)"
MOVED_NEVER_USED = (
    "a restart given this run's state after stop {stop}, its {what} moved by one ({moved}), wrote the "
    "uninterrupted run's {outputs} bit for bit: nothing moved reached them, so it never used those weights (it "
    "trains again from the step and seed it reads, or keeps its weights elsewhere: another file, outside its "
    "directories; or it refuses a changed checkpoint, a checksum's doing, and then this cannot tell); the "
    "restarts above may have done the same (logs/{log}.log)"
)
MOVED_NOT_SHOWN = (
    "whether the restart after stop {stop} used the weights it read (a restart given its state with its weights "
    "moved): {note}"
)
OUTSIDE = (
    "{same}, but the command wrote outside its run's directories, beside them in --out's {where}: what it keeps "
    "there every attempt finds, and a restart on another machine does not, so the resume is not proven (keep all "
    "state in the work directory)"
)
MOMENTS = (
    "; at these moments only: each stop came after its attempt's first save, so after the {first}{of} "
    "(more --stops, or --at-line, reaches later ones)"
)
# What the moved-weights restart cannot show: it runs in another directory, so state a script keeps at a path
# derived from its own (/dev/shm/<hash of its work directory>) is found by its restarts here, and not by it,
# nor by a restart on another machine.
OUTSIDE_NOT_CHECKED = (
    "state kept outside the run's directories at a path its restarts find again (/dev/shm, a fixed path, one "
    "named after the work directory): the restarts here could read it, a restart in another directory (the "
    "moved-weights restart, where one ran) could not; only a restart on another machine shows it (reprocube "
    "reproduce there)"
)
REPLAY_AFTER_MOVED = (
    "whether the stopped run's own restarts used the weights they read: the moved-weights restarts did (another "
    "first loss with the weights moved), but they ran in another directory, where a script can take another "
    "path (a run id from its directory), and a first loss can move through another trained tensor the probe "
    "records (an EMA copy)"
)
REPLAY_NOT_CHECKED = (
    "whether the restarts used the weights they read, rather than training the updates before their first "
    "again unrecorded (a deterministic replay ends with the same bits): only timing speaks to that, and a cache "
    "or work a restart skips can hide a replay"
)
NO_WAIT = (
    "state that expires with time (a wall-clock budget or a lease kept in the checkpoint): every restart came "
    "at once after its stop, none a while later"
)
WAITED = (
    "state that expires with time (a wall-clock budget or a lease kept in the checkpoint) over more than "
    "{seconds} s: the last restart came {seconds} s after its stop, the others at once; a longer absence (a "
    "preemption of minutes) was not tried"
)
# What --quick leaves out, first among the not-checked lines (the pass names the first of them)
QUICK_LEFT_OUT = (
    "--quick: one uninterrupted run, so whether two agree was not checked before the stops (a difference after "
    "a stop is still checked against more uninterrupted runs); no negative control; no restart given another "
    "run's state or its weights moved, so whether the restarts used the state they read was not checked; every "
    "restart at once, so state that expires with time was not tried"
)
QUICK_NOT_RUN = "not run (--quick)"
DURING_SAVE_MISSED = (
    "{stops} meant to land during a save came once the save was whole (its files written faster than the "
    "signal reached the script): a stop during a save was not tried there"
)
UNCONFIRMED = (
    "{restarts}, {found}; but --quick made one uninterrupted run, and the more uninterrupted runs that tell a "
    "difference of the process from one of the resume failed ({failed}): nothing shows it is resume's"
)
ONE_STOP = (
    "a restart from a checkpoint that a resumed attempt saved: one stop was made (--stops 2 stops the restart too)"
)
