"""docs/frameworks.md's table (issue 56), row by row: what the trainers' own resume does, measured by
`reprocube check` on the examples, each row's truth established here without reprocube.

For every row the test runs the example twice by itself: once uninterrupted, once stopped by SIGTERM (to
its process group, as a scheduler does) at the same output line as check and started again until it ends;
the truth is whether the two final weight files have the same sha256 (rows with the same command share its
uninterrupted run). Beside it, check runs the row's own
command line. The test asserts that check's verdict is the row's, and that it never says more than the
truth: resume-exact only where the two files are identical, resume-differs only where they differ. The
first differing update check names (the probe's callbacks, or its two calls) is the row's too. A last test
reads the table in docs/frameworks.md and requires exactly these rows, with these verdicts and steps, so
the table cannot drift from what was measured.

Cost (2 CPUs): the truth and check run side by side; rows are few and the models tiny. A row whose
framework is not installed is skipped (pip install 'reprocube[trainers]'; make test installs it)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from helpers import reprocube

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
TABLE = REPO / "docs" / "frameworks.md"


@dataclass(frozen=True)
class Row:
    name: str  # the table's first column
    needs: str  # the module the example imports
    script: str  # in examples/
    args: tuple[str, ...]
    output: str  # the final weights: what check compares and the truth hashes
    at_line: str  # where both stop it (each attempt at its first matching line, `stops` times)
    stops: int
    verdict: str
    first_step: int | None  # check's first differing update (the probe)
    ranks: int = 1  # processes, each writing its probe trace
    extra: tuple[tuple[int, int], ...] = ()  # updates the stopped run made beyond the uninterrupted run's
    trainer_said: str | None = None  # the trainer's own warning, named in the verdict (check.trainer_words)
    during_save: bool = False  # the stop lands while a checkpoint is written (check --during-save; at_line unused)


TORCHRUN = ("-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2")


ROWS = [
    Row("hf-trainer", "transformers", "hf_trainer.py", ("--epochs", "2"), "model.safetensors",
        r"step 8 saved", 1, "resume-exact", None),
    Row("hf-trainer-stop-during-save", "transformers", "hf_trainer.py", ("--epochs", "2"), "model.safetensors",
        "", 1, "save-interrupted", None, during_save=True),
    Row("lightning", "lightning", "lightning_fit.py", ("--epochs", "2"), "model.safetensors",
        r"step 16 saved", 1, "resume-differs", 17),
    Row("lightning-save-rng", "lightning", "lightning_fit.py", ("--epochs", "2", "--save-rng"), "model.safetensors",
        r"step 16 saved", 1, "resume-exact", None),
    Row("lightning-save-rng-mid-epoch", "lightning", "lightning_fit.py", ("--epochs", "2", "--save-rng"),
        "model.safetensors", r"step 8 saved", 1, "resume-differs", 9,
        trainer_said="Lightning warned in the restart that its dataloader is not resumable"),
    Row("keras-epoch", "keras", "keras_fit.py", ("--epochs", "3"), "model.weights.h5",
        r"epoch 1 saved", 1, "resume-differs", 33),
    Row("keras-epoch-seeds", "keras", "keras_fit.py", ("--epochs", "3", "--epoch-seeds"), "model.weights.h5",
        r"epoch 1 saved", 1, "resume-exact", None),
    Row("keras-save-freq", "keras", "keras_fit.py", ("--epochs", "3", "--save-freq", "16", "--epoch-seeds"),
        "model.weights.h5", r"step 48 saved", 1, "resume-differs", 49, extra=((97, 112),)),
    Row("accelerate", "accelerate", "accelerate_loop.py", (), "model.safetensors",
        r"step 8 saved", 1, "resume-differs", 9),
    Row("accelerate-seedable-sampler", "accelerate", "accelerate_loop.py", ("--seedable-sampler",),
        "model.safetensors", r"step 8 saved", 1, "resume-differs", 9),
    Row("accelerate-seedable-sampler-rng-after-fetch", "accelerate", "accelerate_loop.py",
        ("--seedable-sampler", "--rng-after-fetch"), "model.safetensors", r"step 8 saved", 1, "resume-exact", None),
    Row("accelerate-seedable-sampler-rng-after-fetch-epoch-end", "accelerate", "accelerate_loop.py",
        ("--seedable-sampler", "--rng-after-fetch"), "model.safetensors", r"step 16 saved", 1, "resume-exact", None),
    Row("torchrun", "torch", "torchrun_ddp.py", (), "model.safetensors", r"epoch 1 saved", 1, "resume-differs", 17, 2),
    Row("torchrun-save-rng", "torch", "torchrun_ddp.py", ("--save-rng",), "model.safetensors", r"epoch 1 saved", 1,
        "resume-exact", None, 2),
]  # fmt: skip


def command(row: Row) -> list[str]:
    launcher = TORCHRUN if row.ranks > 1 else ()
    return [sys.executable, *launcher, str(EXAMPLES / row.script), *row.args]


def attempts(cmd: list[str], cwd: Path, at_line: str | None, stops: int) -> list[int]:
    """Run cmd in cwd until it ends, SIGTERM to its group at the first line matching at_line in each of
    the first `stops` attempts (then started again): the attempts' exit statuses."""
    cwd.mkdir(parents=True)
    env = {**os.environ, "SEED": "0", "PYTHONHASHSEED": "0", "TF_CPP_MIN_LOG_LEVEL": "3"}
    env.pop("REPROCUBE_PROBE", None)
    statuses = []
    for attempt in range(stops + 1):
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)  # fmt: skip
        lines, stopped = [], False
        for line in proc.stdout:
            lines.append(line)
            if attempt < stops and not stopped and re.search(at_line, line):
                os.killpg(proc.pid, signal.SIGTERM)
                stopped, seen = True, len(lines)
        statuses.append(proc.wait(timeout=300))
        proc.stdout.close()
        if attempt < stops:  # the stop fell before the next save (a framework may finish its batch first)
            assert stopped, f"attempt {attempt + 1} ended before its stop:\n{''.join(lines[-20:])}"
            later = [line for line in lines[seen:] if "saved" in line]
            assert not later, f"attempt {attempt + 1} went on past its stop: {later}"
        else:
            assert statuses[-1] == 0, "".join(lines[-20:])
    return statuses


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


UNINTERRUPTED: dict[tuple[str, ...], str] = {}  # a command's uninterrupted weights, run once for the rows sharing it


def together(*calls):
    """Run the calls at once (threads: each mostly waits on its processes); their results in order, the
    first exception raised here (a failed assertion, or a skip)."""
    results, errors = [None] * len(calls), []

    def run(i, call):
        try:
            results[i] = call()
        except BaseException as error:  # noqa: B036 (pytest's skip and failures are BaseExceptions)
            errors.append(error)

    threads = [threading.Thread(target=run, args=(i, call)) for i, call in enumerate(calls)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return results


def truth(row: Row, where: Path) -> dict:
    """The attempts' exit statuses and the sha256 of the final weights, uninterrupted and after the row's
    stops (both runs at once)."""
    runs = {"stopped": (row.at_line, row.stops)}
    if tuple(command(row)) not in UNINTERRUPTED:
        runs["uninterrupted"] = (None, 0)
    statuses = together(*[lambda n=n, a=a: attempts(command(row), where / n, *a) for n, a in runs.items()])
    found = dict(zip(runs, statuses, strict=True))
    for name in runs:
        found[f"{name}_sha256"] = sha256(where / name / row.output)
    found["uninterrupted_sha256"] = UNINTERRUPTED.setdefault(tuple(command(row)), found.get("uninterrupted_sha256"))
    return found


@pytest.mark.process
@pytest.mark.parametrize("row", [r for r in ROWS if not r.during_save], ids=[r.name for r in ROWS if not r.during_save])
def test_row(row, tmp_path):
    pytest.importorskip(row.needs)
    args = ["--output", row.output, "--at-line", row.at_line, "--stops", str(row.stops), "--jobs", "2"]
    found, proc = together(
        lambda: truth(row, tmp_path / "truth"),
        lambda: reprocube("check", "--out", "check", *args, "--", *command(row), cwd=tmp_path, check=False,
                          timeout=900, env_extra={"TF_CPP_MIN_LOG_LEVEL": "3"}),
    )  # fmt: skip
    result = json.loads((tmp_path / "check" / "check.json").read_text())
    assert len(found["stopped"]) == row.stops + 1, found  # the truth's stops landed, as check's did
    exact = found["uninterrupted_sha256"] == found["stopped_sha256"]
    assert exact == (row.verdict == "resume-exact"), (row.name, found)
    # check never says more than the truth: exact only where the weights are the same file, and the reverse.
    assert result["verdict"] == row.verdict, proc.stdout + proc.stderr
    assert result["verdict"] == ("resume-exact" if exact else "resume-differs")
    stopped = next(run for run in result["runs"] if run["name"] == "stopped")
    assert stopped["stops_landed"] == row.stops
    traced = result["probe"]["resume"]
    assert traced.get("ranks", [0]) == list(range(row.ranks)), traced  # one trace per rank, each compared
    assert traced["extra_steps"] == [list(span) for span in row.extra], traced
    for rank in traced.get("per_rank", []):  # every rank compared in full, and where it departs
        assert (rank["compared_steps"], rank["first_difference"]) == (traced["reference_steps"], row.first_step), rank
    first = traced["first_difference"]
    assert (first and first["step"]) == row.first_step, first
    # The trainer's own words where it said why, and nowhere else.
    assert ("The trainer said why itself" in result["summary"]) == bool(row.trainer_said), result["summary"]
    assert row.trainer_said is None or row.trainer_said in result["summary"], result["summary"]
    if row.first_step is not None:
        assert first["after_stop"] == 1 and first["tensors"], first
    else:
        assert traced["compared_steps"] == traced["reference_steps"] > 0, traced
    # The very files: check's uninterrupted and stopped runs wrote the bytes the truth's runs wrote.
    [compared] = [f for f in result["comparisons"]["resume"]["files"] if f["path"] == row.output]
    assert (compared["same"], compared["sha256_a"], compared["sha256_b"]) == (
        exact,
        found["uninterrupted_sha256"],
        found["stopped_sha256"],
    ), compared


def stopped_during_the_second_save(cmd: list[str], cwd: Path) -> list[int]:
    """The truth of a stop during a save: cmd run in cwd, SIGTERM to its group as soon as a second
    checkpoints/checkpoint-N/ folder exists (the first one whole, the second being written: the Trainer makes
    the folder, then writes its files into it), then started again once: the attempts' exit statuses."""
    cwd.mkdir(parents=True)
    env = {**os.environ, "SEED": "0", "PYTHONHASHSEED": "0"}
    env.pop("REPROCUBE_PROBE", None)
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)  # fmt: skip
    folders = cwd / "checkpoints"
    while proc.poll() is None:
        if folders.is_dir() and len(list(folders.glob("checkpoint-*"))) >= 2:
            os.killpg(proc.pid, signal.SIGTERM)
            break
        time.sleep(0.001)
    statuses = [proc.wait(timeout=300)]
    assert statuses[0] == -signal.SIGTERM, "the run ended before its second checkpoint began"
    second = max(folders.glob("checkpoint-*"), key=lambda p: int(p.name.rpartition("-")[2]))
    partial = len(list(second.iterdir()))
    restart = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    return [*statuses, restart.returncode, partial]


@pytest.mark.process
def test_a_stop_during_the_trainers_save(tmp_path):
    """docs/frameworks.md's hf-trainer-stop-during-save: the HF Trainer writes a checkpoint's files into its
    checkpoint-N/ folder in place and resumes from the newest folder: a stop while the second one is written
    (truth: by hand, at the folder's appearance) leaves a run whose restart fails; check --during-save says
    save-interrupted, naming the folder, and the Trainer's own error."""
    [row] = [r for r in ROWS if r.during_save]
    pytest.importorskip(row.needs)
    args = ["--output", row.output, "--during-save", "--jobs", "2"]
    (first, restart, partial), proc = together(
        lambda: stopped_during_the_second_save(command(row), tmp_path / "truth"),
        lambda: reprocube("check", "--out", "check", *args, "--", *command(row), cwd=tmp_path, check=False, timeout=900),
    )  # fmt: skip
    assert restart != 0, f"the truth's restart resumed from a folder of {partial} files"
    result = json.loads((tmp_path / "check" / "check.json").read_text())
    assert result["verdict"] == row.verdict and proc.returncode == 13, proc.stdout + proc.stderr
    assert "checkpoints/checkpoint-16/ was being written" in result["summary"], result["summary"]
    # the Trainer's own error, as far as the write had come: no model file yet, or a later file of the folder missing
    trainers = r"Can't find a valid checkpoint|No such file or directory: 'checkpoints/checkpoint-16/"
    assert re.search(trainers, result["summary"]), result["summary"]


def table_rows() -> dict[str, list[str]]:
    rows = {}
    for line in TABLE.read_text().splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        match = re.fullmatch(r"`([a-z0-9-]+)`", cells[0]) if line.startswith("|") else None
        if match:
            rows[match[1]] = cells
    return rows


def test_the_table_holds_exactly_the_measured_rows():
    """docs/frameworks.md: one row per ROWS entry, named in its first column, its verdict and first
    differing update as measured here (and nothing measured that the table leaves out)."""
    rows = table_rows()
    assert list(rows) == [row.name for row in ROWS]
    for row in ROWS:
        text = " | ".join(rows[row.name])
        assert f"`{row.verdict}`" in text, (row.name, text)
        if row.first_step is not None:
            assert f"step {row.first_step}" in text, (row.name, text)
        assert f"examples/{row.script}" in text and " ".join(row.args) in text, (row.name, text)


GPU_RECORDS = [REPO / "benchmarks" / "gpu" / "h200-2026-11-27" / call / "trainers.tgz" for call in ("call2", "call3")]


def test_the_gpu_column_is_what_the_lent_gpu_recorded():
    """docs/frameworks.md's H200 column against the raw record committed from the lease (scripts/gpu_trainers.py):
    each row run there shows the verdict check gave, which agreed with the truth set up beside it; every
    other row says it was not run."""
    import tarfile

    measured = {}
    for path in GPU_RECORDS:  # a later call's record of a row replaces an earlier one's
        with tarfile.open(path) as archive:
            measured.update({record["row"]: record for record in json.load(archive.extractfile("./trainers.json"))})
    header = [
        cell.strip() for cell in TABLE.read_text().split("| row | framework |", 1)[1].split("\n", 1)[0].split("|")
    ]
    column = header.index("on an H200 (CUDA)") + 2  # "row" and "framework" were split off
    for name, cells in table_rows().items():
        record = measured.pop(name, None)
        if record is None:
            assert cells[column].startswith("not run"), (name, cells[column])
            continue
        assert record["agrees_with_truth"] and record["truth"]["exact"] == (record["verdict"] == "resume-exact")
        assert cells[column].count("`resume-") == 1 and f"`{record['verdict']}`" in cells[column], (name, cells)
        first = record["first_difference"]
        assert (f"step {first['step']}" in cells[column]) if first else "step" not in cells[column], (name, cells)
    assert not measured, f"recorded on the GPU, missing from the table: {sorted(measured)}"
