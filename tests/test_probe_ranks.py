"""reprocube.probe across processes (issue 53, item 7) and the hint at a difference's cause (item 8):
each rank of a torchrun/Accelerate job writes its own trace (rank 0 at REPROCUBE_PROBE, rank r beside it),
the rank is taken from the launcher's variables only and refused unless it is a plain integer 0..65535,
the reader takes exactly the rank files of the attempt, and two runs are compared rank by rank."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from reprocube import probe
from reprocube.analysis import probe_trace
from reprocube.analysis.probe_trace import read_rank_traces, read_trace
from reprocube.analysis.probe_trace_comparison import (
    cause_hint,
    compare_ranks,
    compare_stopped,
    compare_stopped_ranks,
    describe_difference,
)
from reprocube.errors import CheckpointError

# Each rank trains the same 4 steps; rank 1 of a run started with DEPART=k records another loss at step k.
SCRIPT = """
import os, numpy as np
from reprocube import probe
rank, depart = int(os.environ.get("RANK", "0")), int(os.environ.get("DEPART", "0"))
w = np.full(3, float(rank), np.float32)
for step in range(1, 5):
    w = w + np.float32(0.5)
    loss = np.float32(step + (1 if rank == 1 and step == depart else 0))
    probe.step(loss, {"w": w})
probe.checkpoint(4)
"""


def run_ranks(directory, world: int = 2, depart: int = 0, ranks=None) -> None:
    """The script as `world` processes of one job, all given the same REPROCUBE_PROBE."""
    directory.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", SCRIPT],
            env={
                **env,
                probe.ENV: str(directory / "attempt-1.jsonl"),
                "RANK": str(rank),
                "WORLD_SIZE": str(world),
                "DEPART": str(depart),
            },
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in (range(world) if ranks is None else ranks)
    ]
    for process in processes:
        _, err = process.communicate(timeout=120)
        assert process.returncode == 0, err


@pytest.mark.process
def test_every_rank_of_a_job_writes_its_own_trace_and_the_reader_reads_them_all(tmp_path):
    """Before: rank 1 opened the same path as rank 0 with O_EXCL and failed with FileExistsError."""
    run_ranks(tmp_path / "a")
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["attempt-1.jsonl", "attempt-1.rank-1.jsonl"]
    traces = read_rank_traces(tmp_path / "a" / "attempt-1.jsonl")
    assert sorted(traces) == [0, 1]
    assert [(t.rank, t.world_size) for t in traces.values()] == [(0, 2), (1, 2)]
    assert [len(t.updates) for t in traces.values()] == [4, 4] and traces[1].checkpoints == [4]
    assert traces[0].updates[0][1].fingerprints != traces[1].updates[0][1].fingerprints  # each its own weights
    # A single-rank reader still reads rank 0's trace where it always was.
    assert read_trace(tmp_path / "a" / "attempt-1.jsonl").updates == traces[0].updates
    assert probe.rank_path(str(tmp_path / "a" / "attempt-1.jsonl"), 1) == str(traces[1].path)


@pytest.mark.process
def test_a_difference_on_one_rank_only_is_found_and_names_its_rank(tmp_path):
    run_ranks(tmp_path / "a")
    run_ranks(tmp_path / "b", depart=3)
    a, b = (read_rank_traces(tmp_path / name / "attempt-1.jsonl") for name in ("a", "b"))
    result = compare_ranks(a, b)
    first = result["first_difference"]
    assert (first["rank"], first["step"], first["loss_same"], first["tensors"]) == (1, 3, False, [])
    assert [r["first_difference"] is None for r in result["per_rank"]] == [True, False]
    assert "error" not in result and compare_ranks(a, read_rank_traces(tmp_path / "a" / "attempt-1.jsonl")) == {
        "ranks": [0, 1],
        "per_rank": [
            {"rank": r, "a_steps": 4, "b_steps": 4, "same_steps": True, "first_difference": None} for r in (0, 1)
        ],
        "first_difference": None,
    }
    assert describe_difference(first, "first run", "second run").startswith("on rank 1, loss 4.0 second run vs 3.0")
    # The same job stopped and resumed, rank by rank: rank 1's difference, named, after no stop.
    stopped = compare_stopped_ranks(a, [b])
    assert (stopped["rank"], stopped["first_difference"]["rank"], stopped["first_difference"]["step"]) == (1, 1, 3)
    assert stopped["first_difference"]["after_stop"] == 0 and stopped["ranks"] == [0, 1]
    assert compare_stopped_ranks({}, [b]) is None  # the uninterrupted run wrote no trace: nothing to compare


@pytest.mark.process
def test_a_rank_that_wrote_a_trace_in_one_run_only_is_a_difference(tmp_path):
    run_ranks(tmp_path / "a")
    run_ranks(tmp_path / "b", ranks=[0])  # rank 1 of the second run never called the probe
    a, b = (read_rank_traces(tmp_path / name / "attempt-1.jsonl") for name in ("a", "b"))
    assert compare_ranks(a, b)["error"] == "rank 1 wrote a probe trace in the first run only"
    assert compare_stopped_ranks(a, [b])["error"] == "rank 1 wrote a probe trace in the uninterrupted run only"
    assert compare_stopped_ranks(b, [a])["error"] == "rank 1 wrote a probe trace in the stopped run only"


@pytest.mark.parametrize(
    "env",
    [
        {"RANK": "-1"},
        {"RANK": "65536"},
        {"RANK": "1e3"},
        {"RANK": " 1"},
        {"RANK": "1\n"},
        {"RANK": "0x1"},
        {"RANK": "+1"},
        {"RANK": "01"},
        {"RANK": "\u0661"},  # an Arabic-Indic 1: int() takes it, the probe does not
        {"RANK": ""},
        {"RANK": "9" * 5000},
        {"LOCAL_RANK": "../1"},
        {"RANK": "2", "WORLD_SIZE": "2"},
        {"RANK": "0", "WORLD_SIZE": "0"},
        {"RANK": "0", "WORLD_SIZE": "two"},
    ],
)
def test_a_hostile_rank_is_refused_at_the_probes_first_call(tmp_path, monkeypatch, env):
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv(probe.ENV, str(tmp_path / "attempt-1.jsonl"))
    monkeypatch.setattr(probe, "_recorder", None)
    monkeypatch.setattr(probe, "_started", False)
    with pytest.raises(ValueError, match="is not (an integer from|below WORLD_SIZE)"):
        probe.step(np.float32(1), {"w": np.ones(2, np.float32)})
    assert list(tmp_path.iterdir()) == []  # nothing written anywhere


def test_the_rank_comes_from_the_launchers_variables_only(monkeypatch):
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SLURM_PROCID", "5")  # not documented as a rank source: ignored
    assert probe.rank() == (0, None, False)
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert probe.rank() == (3, None, True)
    monkeypatch.setenv("RANK", "65535")  # the global rank first
    assert probe.rank() == (65535, None, True)
    monkeypatch.setenv("WORLD_SIZE", "65536")
    assert probe.rank() == (65535, 65536, True)
    assert probe.rank_path("/x/attempt-1.jsonl", 7) == "/x/attempt-1.rank-7.jsonl"
    assert probe.rank_path("/x/attempt-1.jsonl", 0) == "/x/attempt-1.jsonl"


def write(path, records) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def trace_lines(rank=None, world=2, loss="0000803f", resumed=None) -> list[dict]:
    header = {"probe": 1, **({"rank": rank, "world_size": world} if rank is not None else {})}
    return [
        header,
        *([{"resumed": resumed}] if resumed is not None else []),
        {"names": ["w"]},
        {"index": 1, "step": None, "loss": loss, "loss_dtype": "float32", "fingerprints": [7]},
    ]


def test_the_reader_takes_exactly_the_attempts_rank_files(tmp_path, monkeypatch):
    write(tmp_path / "attempt-1.jsonl", trace_lines(0))
    write(tmp_path / "attempt-1.rank-2.jsonl", trace_lines(2, world=3))
    for name in (  # none of these is a rank file of attempt 1: never opened (each is not even a trace)
        "attempt-1.rank-0.jsonl",
        "attempt-1.rank-01.jsonl",
        "attempt-1.rank-70000.jsonl",
        "attempt-1.rank-1.jsonl.bak",
        "attempt-1.rank-+1.jsonl",
        "attempt-10.rank-1.jsonl",
        "attempt-1.rank-\u0661.jsonl",
    ):
        (tmp_path / name).write_text("not json\n")
    with pytest.raises(CheckpointError, match="world sizes"):  # rank 0 says 2 processes, rank 2 says 3
        read_rank_traces(tmp_path / "attempt-1.jsonl")
    write(tmp_path / "attempt-1.jsonl", trace_lines(0, world=3))
    assert sorted(read_rank_traces(tmp_path / "attempt-1.jsonl")) == [0, 2]
    write(tmp_path / "attempt-1.rank-3.jsonl", trace_lines(2, world=3))  # a rank-3 file saying rank 2
    with pytest.raises(CheckpointError, match="rank-3.jsonl: the trace of rank 3 says rank 2"):
        read_rank_traces(tmp_path / "attempt-1.jsonl")
    write(tmp_path / "attempt-1.rank-3.jsonl", trace_lines(None))  # or no rank at all
    with pytest.raises(CheckpointError, match="the trace of rank 3 says rank 0"):
        read_rank_traces(tmp_path / "attempt-1.jsonl")
    (tmp_path / "attempt-1.rank-3.jsonl").unlink()
    write(tmp_path / "attempt-1.rank-4.jsonl", trace_lines(4, world=3))  # a rank not below its world size
    with pytest.raises(CheckpointError, match="rank must be an integer from 0 to 2"):
        read_rank_traces(tmp_path / "attempt-1.jsonl")
    (tmp_path / "attempt-1.rank-4.jsonl").unlink()
    (tmp_path / "attempt-1.rank-5.jsonl").symlink_to(tmp_path / "attempt-1.rank-2.jsonl")  # never followed
    with pytest.raises(CheckpointError, match="rank-5.jsonl"):
        read_rank_traces(tmp_path / "attempt-1.jsonl")
    (tmp_path / "attempt-1.rank-5.jsonl").unlink()
    monkeypatch.setattr(probe_trace, "MAX_RANKS", 1)  # bounded: more rank files than that is refused
    write(tmp_path / "attempt-1.rank-1.jsonl", trace_lines(1, world=3))
    with pytest.raises(CheckpointError, match="more than 1 rank traces of attempt-1.jsonl"):
        read_rank_traces(tmp_path / "attempt-1.jsonl")
    assert read_rank_traces(tmp_path / "elsewhere" / "attempt-1.jsonl") == {}


def test_a_header_rank_is_read_strictly(tmp_path):
    for header, message in (
        ({"probe": 1, "rank": -1, "world_size": None}, "rank must be an integer from 0 to 65535"),
        ({"probe": 1, "rank": True, "world_size": None}, "rank must be an integer"),
        ({"probe": 1, "rank": 1}, "world_size is missing"),
        ({"probe": 1, "rank": 0, "world_size": 0}, "world_size must be an integer from 1 to 65536"),
    ):
        write(tmp_path / "t.jsonl", [header, {"names": ["w"]}])
        with pytest.raises(CheckpointError, match=f"t.jsonl:1: {message}"):
            read_trace(tmp_path / "t.jsonl")
    write(tmp_path / "attempt-1.jsonl", trace_lines(1))  # rank 0's path holding rank 1's trace
    with pytest.raises(CheckpointError, match="rank 0's trace says rank 1"):
        read_rank_traces(tmp_path / "attempt-1.jsonl")


def test_where_a_restart_resumed_may_be_said_by_the_script(tmp_path):
    """probe.resumed(s) before the first step places the attempt at s (how: given), where neither the
    first update's bits nor an announced checkpoint would have (the old reader assumed step 0 here)."""
    recorder = probe._Recorder(str(tmp_path / "attempt-2.jsonl"))
    recorder.resumed(5)
    with pytest.raises(ValueError, match="once, before"):
        recorder.resumed(5)
    with pytest.raises(ValueError, match="the last was 5"):
        recorder.step(np.float32(1), {"w": np.ones(2, np.float32)}, 5)
    recorder.step(np.float32(9), {"w": np.ones(2, np.float32)}, None)
    recorder.flush()
    with pytest.raises(ValueError, match="once, before"):
        recorder.resumed(6)
    attempt = read_trace(tmp_path / "attempt-2.jsonl")
    assert attempt.resumed == 5
    clean = probe._Recorder(str(tmp_path / "clean.jsonl"))
    for step in range(1, 8):
        clean.step(np.float32(step), {"w": np.full(2, step, np.float32)}, None)
    clean.flush()
    result = compare_stopped(read_trace(tmp_path / "clean.jsonl"), [None, attempt])
    assert (result["attempts"][1]["resumed_at"], result["attempts"][1]["how"]) == (5, "given")
    assert result["first_difference"]["step"] == 6
    lines = trace_lines(resumed=2)
    write(tmp_path / "late.jsonl", [*lines, {"resumed": 2}])
    with pytest.raises(CheckpointError, match="late.jsonl:5: resumed is said once, before the first update"):
        read_trace(tmp_path / "late.jsonl")
    write(tmp_path / "back.jsonl", [*lines[:3], {**lines[3], "step": 2}])  # a given step not after it
    with pytest.raises(CheckpointError, match="back.jsonl:4: step must be an integer from 3"):
        read_trace(tmp_path / "back.jsonl")


def difference(loss_same: bool, tensors: list[str], step: int = 33) -> dict:
    return {
        "step": step,
        "loss_a": "0.5",
        "loss_b": "0.5" if loss_same else "0.25",
        "loss_same": loss_same,
        "tensors": tensors,
        "tensor_count": 6,
    }


def test_the_same_loss_but_other_weights_points_at_the_optimizers_state():
    hint = cause_hint(difference(True, ["0.bias", "0.weight"]))
    assert hint.startswith("the same loss but other weights at update 33 (0.bias, 0.weight): ")
    assert "optimizer's state (momentum, Adam's moments, the learning-rate schedule" in hint
    assert describe_difference(difference(True, ["0.bias"])) == "the same loss; weights differ in 0.bias"
    assert describe_difference(difference(True, ["0.bias"]), hint=True).endswith("restored from another step")


def test_another_loss_points_at_the_data_order_an_rng_or_the_models_state():
    hint = cause_hint(difference(False, ["bn.running_mean", "fc.weight"], step=7))
    assert hint.startswith("another loss at update 7: the forward pass saw other inputs or other randomness")
    assert "data order" in hint and "random generator (dropout" in hint
    assert "batch-norm statistics (bn.running_mean differ)" in hint
    assert hint.endswith("the weights after it differ in bn.running_mean, fc.weight")
    assert cause_hint(difference(True, [])) is None  # nothing to point at


@pytest.mark.process
def test_every_first_difference_carries_its_hint(tmp_path):
    """check.json stores the differences as they are: the hint travels as their cause_hint field."""
    run_ranks(tmp_path / "a")
    run_ranks(tmp_path / "b", depart=2)
    a, b = (read_rank_traces(tmp_path / name / "attempt-1.jsonl") for name in ("a", "b"))
    first = compare_ranks(a, b)["first_difference"]
    assert first["cause_hint"] == cause_hint(first) and first["cause_hint"].startswith("another loss at update 2")
    stopped = compare_stopped(a[1], [b[1]])["first_difference"]
    assert stopped["cause_hint"].startswith("another loss at update 2")
