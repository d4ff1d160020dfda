"""kill -9 soak: a run killed with SIGKILL at 20 random moments (no handler runs, nothing is flushed or
cleaned up), restarted each time with resume=auto, must end bit-identical to an uninterrupted run: the
same checkpoints with the same weights, metrics.jsonl without a repeated or lost line, and no
temporary left behind. The kill moments come from a seeded generator (the same plan on every run of
the test) and are spread over the whole run: most while training (after the attempt has written its
session, at a target global step plus a random fraction of a few steps), some during start-up
(imports, the checkpoint's verification and restore, the rewrite of metrics.jsonl)."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from reprocube.training.metrics import DETERMINISTIC_EPOCH_FIELDS

from helpers import ProcessEnded, manifest, reprocube, wait_until

ATTEMPTS = 20
SEED = 20_150  # the kill plan; change it to soak other moments
STEPS_PER_EPOCH, EPOCHS = 21, 3
TOTAL_STEPS = STEPS_PER_EPOCH * EPOCHS
STARTUP_KILLS = 0.25  # the share of attempts killed before their session starts
ENV = {**os.environ, "PYTHONHASHSEED": "0"}


def train_args(generated) -> list[str]:
    return [
        "train",
        "framework=pytorch",
        *generated.overrides(),
        f"epochs={EPOCHS}",
        "checkpoint.every_steps=2",
        "log.every_steps=1",
    ]


def start(cwd: Path, args: list[str], stderr) -> subprocess.Popen:
    # its own process group: the kill reaches any child too, and nothing else
    return subprocess.Popen(
        [sys.executable, "-m", "reprocube", *args],
        cwd=cwd,
        stdout=subprocess.DEVNULL,
        stderr=stderr,
        env=ENV,
        start_new_session=True,
    )


def file_signature(path: Path) -> tuple[int, int] | None:
    """(inode, size): changes when sessions.jsonl is appended to or atomically replaced."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return None
    return info.st_ino, info.st_size


def last_global_step(metrics: Path) -> int:
    try:
        data = metrics.read_bytes()
    except FileNotFoundError:
        return -1
    for line in reversed(data.split(b"\n")):
        if line.endswith(b"}"):
            try:
                return json.loads(line)["global_step"]
            except (ValueError, KeyError):
                continue
    return -1


def checkpoint_digests(run: Path) -> dict[str, str]:
    """weights_digest of every checkpoint (epoch and step ones), by name."""
    return {p.name: manifest(p)["weights_digest"] for p in sorted((run / "checkpoints").iterdir())}


def metrics_problems(run: Path, reference: Path) -> list[str]:
    """What is wrong with a run's metrics.jsonl against the reference's: a repeated line or record, and any
    difference in the deterministic fields (every step record whole; the epoch records without wall_s and
    samples_per_s). Strict on purpose: a resume that replayed steps without rewriting the file from the
    checkpoint's history would repeat step records; one that lost the tail would miss some."""
    lines = (run / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    problems = [f"line repeated: {line}" for i, line in enumerate(lines) if line in lines[:i]]
    keys = [(r["kind"], r["global_step"]) for r in records]
    problems += [f"record repeated: {key}" for i, key in enumerate(keys) if key in keys[:i]]

    def deterministic(records):
        return [
            r if r["kind"] == "step" else {k: r[k] for k in ("kind", *DETERMINISTIC_EPOCH_FIELDS, "weights_digest")}
            for r in records
        ]

    expected = deterministic([json.loads(line) for line in (reference / "metrics.jsonl").read_text().splitlines()])
    if deterministic(records) != expected:
        problems.append(f"deterministic records differ: {len(records)} records, the reference has {len(expected)}")
    return problems


def leftovers(run: Path) -> list[str]:
    """Temporaries a killed process may leave: checkpoint directories being written (.tmp-*), files being
    replaced (*.partial), and checkpoints set aside as unreadable (a kill must never make one)."""
    return sorted(
        str(p.relative_to(run))
        for p in run.rglob("*")
        if p.name.startswith((".tmp-", ".unreadable-")) or p.name.endswith(".partial")
    )


def test_the_checks_notice_a_repeated_line_and_a_leftover(tmp_path):
    """metrics_problems and leftovers can fail (the soak's assertions are not vacuous)."""
    reference, copy = tmp_path / "reference", tmp_path / "copy"
    for run in (reference, copy):
        run.mkdir()
    lines = [
        {"kind": "step", "epoch": 1, "global_step": 1, "loss": 2.3},
        {
            "kind": "epoch",
            "epoch": 1,
            "global_step": 1,
            "train_loss": 2.3,
            "train_accuracy": 0.1,
            "test_loss": 2.2,
            "test_accuracy": 0.2,
            "wall_s": 0.1,
            "samples_per_s": 10.0,
            "weights_digest": "ab",
        },
    ]
    (reference / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    assert metrics_problems(reference, reference) == []
    # another wall time is not a difference
    (copy / "metrics.jsonl").write_text(
        "".join(json.dumps({**r, "wall_s": 9.0} if r["kind"] == "epoch" else r) + "\n" for r in lines)
    )
    assert metrics_problems(copy, reference) == []
    (copy / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [lines[0], *lines]))
    assert metrics_problems(copy, reference)[0].startswith("line repeated")
    (copy / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [lines[1]]))
    assert metrics_problems(copy, reference) == ["deterministic records differ: 1 records, the reference has 2"]
    assert leftovers(copy) == []
    (copy / ".metrics.jsonl.k2j3.partial").write_text("")
    (copy / "checkpoints" / ".tmp-step-000004-123").mkdir(parents=True)
    assert leftovers(copy) == [".metrics.jsonl.k2j3.partial", "checkpoints/.tmp-step-000004-123"]


def until(condition, proc: subprocess.Popen, what: str) -> bool:
    """True once `condition` holds, False when the attempt ends first (a kill that comes too late)."""
    try:
        return wait_until(condition, timeout=120, what=what, process=proc, interval=0.002)
    except ProcessEnded:
        return False


def kill_after(cwd: Path, args: list[str], err, delay_s: float) -> int:
    """Start an attempt and SIGKILL it `delay_s` after its launch; its exit status."""
    launched = time.monotonic()
    proc = start(cwd, args, err)
    if until(lambda: time.monotonic() - launched > delay_s, proc, "the kill's moment"):
        os.killpg(proc.pid, signal.SIGKILL)
    return proc.wait(timeout=60)


def kill_at_step(cwd: Path, args: list[str], err, run: Path, step: int, delay_s: float) -> int:
    """Start an attempt and SIGKILL it `delay_s` after it has written its session (it then trains) and
    logged global step `step` or later; its exit status."""
    sessions_before = file_signature(run / "sessions.jsonl")
    proc = start(cwd, args, err)
    if until(
        lambda: (
            file_signature(run / "sessions.jsonl") != sessions_before
            and last_global_step(run / "metrics.jsonl") >= step
        ),
        proc,
        f"the session and global step {step}",
    ):
        time.sleep(delay_s)
        os.killpg(proc.pid, signal.SIGKILL)
    return proc.wait(timeout=60)


@pytest.mark.process
def test_kill_9_at_random_moments_then_resume_auto_is_bit_exact(generated, tmp_path):
    args = train_args(generated)
    # The uninterrupted reference, timed: start-up (until its session is written) and training.
    reference = tmp_path / "runs" / "reference"
    with open(tmp_path / "reference.err", "w+") as err:
        launched = time.monotonic()
        proc = start(tmp_path, [*args, "run_name=reference"], err)
        until(lambda: (reference / "sessions.jsonl").exists(), proc, "the reference's session")
        startup_s, started = time.monotonic() - launched, time.monotonic()
        status = proc.wait(timeout=300)
        step_s = (time.monotonic() - started) / TOTAL_STEPS
        err.seek(0)
        assert status == 0, err.read()

    run = tmp_path / "runs" / "soak"
    rng = random.Random(SEED)
    # Where the training kills aim: global steps spread over the whole run (resumes start earlier).
    targets = iter(sorted(rng.randrange(0, TOTAL_STEPS - 2) for _ in range(ATTEMPTS)))
    kills = []
    for attempt in range(ATTEMPTS):
        at_startup, target, fraction = rng.random() < STARTUP_KILLS, next(targets), rng.random()
        with open(tmp_path / f"attempt-{attempt}.err", "w+") as err:
            if at_startup:
                # anywhere from the imports to the session's start (past the restore and the metrics rewrite);
                # at most 0.95 of the reference's start-up: up to 1.1 of it trained 40 steps on an idle machine
                # and left the training kills only the last epoch (the spread assertion below failed)
                status = kill_after(
                    tmp_path, [*args, "run_name=soak", "resume=auto"], err, (0.3 + 0.65 * fraction) * startup_s
                )
            else:
                # between two log lines, inside a checkpoint write, ...
                status = kill_at_step(
                    tmp_path, [*args, "run_name=soak", "resume=auto"], err, run, target, fraction * 3 * step_s
                )
            err.seek(0)
            assert status in (0, -signal.SIGKILL), f"attempt {attempt} exited {status}:\n{err.read()}"
        if status == 0:
            break  # it finished before its kill: the soak is over
        kills.append(("start-up" if at_startup else "training", last_global_step(run / "metrics.jsonl")))

    final = reprocube(*args, "run_name=soak", "resume=auto", cwd=tmp_path)
    assert final.returncode == 0

    training_kills = [step for phase, step in kills if phase == "training"]
    # At most the last few targets can be overtaken by the end of the run; most kills must have landed,
    # over more than one epoch.
    assert len(kills) >= ATTEMPTS // 2 and len(training_kills) >= ATTEMPTS // 3, kills
    assert max(training_kills) - min(training_kills) > STEPS_PER_EPOCH, kills
    assert checkpoint_digests(run) == checkpoint_digests(reference)  # every epoch and step checkpoint
    assert metrics_problems(run, reference) == []
    assert leftovers(run) == []


# Run in a fresh process with a hook: on the Nth temporary file made by files.write_file_atomic (after it
# exists, before its rename), the process SIGKILLs itself. The soak's random kills rarely land inside
# this window of microseconds; this lands there every time.
KILLED_IN_WRITE = """
import os, signal, sys
import reprocube.files as files
when, argv, calls = int(sys.argv[1]), sys.argv[2:], [0]
original = files.make_temp_file
def hooked(*args, **kwargs):
    made = original(*args, **kwargs)
    calls[0] += 1
    if calls[0] == when:
        os.kill(os.getpid(), signal.SIGKILL)
    return made
files.make_temp_file = hooked
from reprocube.cli import main
sys.exit(main(argv))
"""


@pytest.mark.process
def test_a_kill_inside_an_atomic_write_leaves_no_partial_file(generated, tmp_path):
    args = [*train_args(generated)[:-3], "epochs=1", "log.every_steps=5", "run_name=killed-in-write", "resume=auto"]
    run = tmp_path / "runs" / "killed-in-write"
    reprocube(*args, cwd=tmp_path)
    # Resumed (here with nothing left to train), a run rewrites .reprocube-run, config.yaml, then
    # metrics.jsonl from the checkpoint's history: die in the third write.
    proc = subprocess.run(
        [sys.executable, "-c", KILLED_IN_WRITE, "3", *args], cwd=tmp_path, capture_output=True, text=True, env=ENV
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert list(run.glob(".metrics.jsonl.*.partial")), "the hook did not land inside the write"
    reprocube(*args, cwd=tmp_path)  # the next attempt, as a requeued job would
    assert leftovers(run) == []
