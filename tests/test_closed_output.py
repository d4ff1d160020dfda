"""No command ends in a traceback when its stdout or stderr is closed (`>&-`, `2>&-`) or breaks (its reader
went away: `| head -1`). The command does its work to the end and keeps what it wrote; its exit status is
its own, or 120 (EXIT_OUTPUT_LOST) where that would have been 0 and stdout broke (README.md's exit
statuses). Each command runs in a fresh process, as a user's shell starts it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from reprocube.errors import EXIT_CHECKPOINT, EXIT_DIFFERENT, EXIT_OK, EXIT_OUTPUT_LOST

from helpers import reprocube

pytestmark = pytest.mark.process  # every test here starts a process: not in make test-quick

MODES = ("stdout closed", "stderr closed", "stdout broken", "stderr broken")


def run_with(mode: str, args: list[str], cwd: Path) -> tuple[int, str]:
    """`reprocube ARGS` with one stream closed or broken: its status and what its other stream got."""
    command = [sys.executable, "-m", "reprocube", *args]
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    stream, state = mode.split()
    if state == "closed":  # as the shell does it: the program starts without that descriptor
        redirect = ">&-" if stream == "stdout" else "2>&-"
        done = subprocess.run(
            ["sh", "-c", f'exec "$@" {redirect}', "sh", *command], cwd=cwd, env=env, capture_output=True, timeout=300
        )
        return done.returncode, (done.stderr if stream == "stdout" else done.stdout).decode(errors="replace")
    read_end, write_end = os.pipe()
    os.close(read_end)  # nobody reads: every write fails with EPIPE, as after `| head -1` took its line
    try:
        if stream == "stdout":
            done = subprocess.run(command, cwd=cwd, env=env, stdout=write_end, stderr=subprocess.PIPE, timeout=300)
            seen = done.stderr
        else:
            done = subprocess.run(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=write_end, timeout=300)
            seen = done.stdout
    finally:
        os.close(write_end)
    return done.returncode, seen.decode(errors="replace")


def expected_status(mode: str, own: int) -> int:
    return EXIT_OUTPUT_LOST if mode == "stdout broken" and own == EXIT_OK else own


def problems_of(mode: str, status: int, seen: str, own: int, command: str = "") -> list[str]:
    """What is wrong with a run in `mode` of a command whose status with its output is `own`."""
    wrong, label = [], f"{command}, {mode}" if command else mode
    if status != expected_status(mode, own):
        wrong.append(f"{label}: exit {status}, not {expected_status(mode, own)}")
    if "Traceback" in seen or "Exception ignored" in seen:
        wrong.append(f"{label}: a traceback: {seen[-600:]}")
    return wrong


def test_help_with_its_output_closed_or_broken(tmp_path):
    wrong = []
    for mode in MODES:
        status, seen = run_with(mode, ["--help"], tmp_path)
        wrong += problems_of(mode, status, seen, EXIT_OK)
        if mode == "stdout closed" and seen:  # what is printed goes nowhere: the help is not moved to stderr
            wrong.append(f"{mode}: the help went to stderr")
    assert not wrong, "\n".join(wrong)


def test_verify_does_its_work_and_keeps_its_result_whatever_its_output(tmp_path):
    """verify of a data directory that does not exist: every check fails (exit 6, a verdict), and
    verify.json, verify.md and each check's log are written. A broken stdout used to end it at its first
    line (exit 1, nothing written); a closed one, in an AttributeError traceback."""
    args = [f"data_dir={tmp_path / 'missing'}", "framework=pytorch"]
    (tmp_path / "normal").mkdir()
    normal = reprocube("verify", *args, cwd=tmp_path / "normal", check=False)
    assert normal.returncode == EXIT_DIFFERENT, normal.stderr
    written = _files(tmp_path / "normal")
    result = "runs/verify-pytorch/verify.json"
    assert "runs/verify-pytorch/verify.json" in written and "runs/verify-pytorch/logs/reference.log" in written
    wrong = []
    for mode in MODES:
        cwd = tmp_path / mode.replace(" ", "-")
        cwd.mkdir()
        status, seen = run_with(mode, ["verify", *args], cwd)
        wrong += problems_of(mode, status, seen, EXIT_DIFFERENT)
        if _files(cwd) != written:
            wrong.append(f"{mode}: wrote {sorted(_files(cwd))}, not {sorted(written)}")
        elif _passed(cwd / result) is not False or _checks(cwd / result) != _checks(tmp_path / "normal" / result):
            wrong.append(f"{mode}: another result than with its output")
    assert not wrong, "\n".join(wrong)


def test_train_compare_and_report_keep_their_work_with_a_broken_stdout(generated, real_run, tmp_path):
    """A training whose stdout breaks (`reprocube train ... | head -1`) trains to the end, bit-identical
    to real_run (its config, conftest.py), and exits 120; it used to end at its first line (exit 1, no
    checkpoint). compare and report write their files whatever becomes of their output."""
    overrides = ["framework=pytorch", *generated.overrides(), "epochs=1", "log.every_steps=5", "run_name=b"]
    status, seen = run_with("stdout broken", ["train", *overrides], tmp_path)
    wrong = problems_of("stdout broken", status, seen, EXIT_OK, "train")
    assert not wrong, "\n".join(wrong)
    b = tmp_path / "runs" / "b"
    assert (b / "checkpoints" / "epoch-0001").is_dir(), sorted(_files(tmp_path))
    for command, out, own_files in (
        ("compare", "c", {"compare.json", "compare.md"}),
        ("report", "page", {"report.html", "curves.png", "divergence.png"}),
    ):
        runs = [str(real_run), str(b)]
        for mode in ("normal", *MODES):
            destination = tmp_path / f"{out}-{mode.replace(' ', '-')}"
            args = [command, *runs, "--out", str(destination)]
            if mode == "normal":
                done = reprocube(*args, cwd=tmp_path, check=False)
                assert done.returncode == EXIT_OK, done.stdout + done.stderr  # B is bit-identical to real_run
                continue
            status, seen = run_with(mode, args, tmp_path)
            wrong += problems_of(mode, status, seen, EXIT_OK, command)
            if not own_files <= _files(destination):
                wrong.append(f"{command}, {mode}: wrote {sorted(_files(destination))}")
            elif command == "compare" and not _passed(destination / "compare.json"):
                wrong.append(f"{command}, {mode}: compare.json does not say identical")
    assert not wrong, "\n".join(wrong)


def test_an_error_line_that_cannot_be_written_keeps_its_status(tmp_path):
    """The error line goes to stderr: closed or broken, it is lost, and the status is still the error's
    (4 here, not 1)."""
    args = ["compare", str(tmp_path / "absent-a"), str(tmp_path / "absent-b")]
    wrong = []
    for mode in MODES:
        status, seen = run_with(mode, args, tmp_path)
        wrong += problems_of(mode, status, seen, EXIT_CHECKPOINT)
        if mode.startswith("stdout") and not (seen.startswith("reprocube: error: ") and seen.count("\n") == 1):
            wrong.append(f"{mode}: not the one error line: {seen[-600:]}")
    assert not wrong, "\n".join(wrong)


def _files(directory: Path) -> set[str]:
    return {str(p.relative_to(directory)) for p in directory.rglob("*") if p.is_file()} if directory.is_dir() else set()


def _passed(path: Path) -> object:
    return json.loads(path.read_text())["passed"]


def _checks(path: Path) -> list:
    """Each check's name and whether it passed (not its times)."""
    return [(check["name"], check["passed"]) for check in json.loads(path.read_text())["checks"]]
