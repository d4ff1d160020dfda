"""Third-party loader state is checked by our schema before it reaches the library (data.pipeline=loader).

A mid-epoch checkpoint holds torchdata's StatefulDataLoader state_dict (PyTorch) or Grain's iterator state
(JAX) in state.json "loader". Its sha256s detect accidents, not forgery: an attacker edits the state and
recomputes them (as here, with reprocube's own manifest digest), and the libraries trust their states (a
torchdata sampler `next` of -1 resumed silently, with another digest). Each forged case must end with exit
status 4 and one `reprocube: error:` line naming the checkpoint and the key, no traceback; the genuine
checkpoint still resumes bit-exactly. In-process cases check the schema against states the libraries
produce, and that whatever a library still raises on a state becomes a CheckpointError (defence in depth)."""

from __future__ import annotations

import copy
import hashlib
import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from reprocube.data.pipeline import ExampleSource, check_position
from reprocube.data.store import Split
from reprocube.errors import CheckpointError
from reprocube.training.checkpoint import manifest_self_digest

from helpers import epoch_digests, error_lines, reprocube

STEPS = 10  # data.train_limit=320, batch size 32
STOP = 5  # the SIGTERM drill's global step: mid-epoch
LOADER = [
    "data.pipeline=loader",
    "data.workers=2",
    "data.augment=true",
    "data.train_limit=320",
    "epochs=1",
    "log.progress=false",
]
CHECKPOINT = Path("checkpoints") / f"step-{STOP:06d}"
TORCH_MAIN = ("torchdata", "_snapshot", "_main_snapshot")
TORCH_SAMPLER = (*TORCH_MAIN, "_sampler_iter_state", "sampler_state")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("loader-state")


def stopped_run(framework: str, generated, workdir: Path) -> tuple[Path, str]:
    """(a run stopped by SIGTERM mid-epoch 1, its checkpoint holding the loader's state; the weights digest
    of the same run uninterrupted)."""
    common = ["train", f"framework={framework}", *generated.overrides(), *LOADER]
    stopped = reprocube(*common, f"run_name={framework}-stopped", f"preempt_at_step={STOP}", cwd=workdir, check=False)
    assert stopped.returncode == 75, stopped.stderr
    reprocube(*common, f"run_name={framework}-whole", cwd=workdir)
    return workdir / "runs" / f"{framework}-stopped", epoch_digests(workdir / "runs" / f"{framework}-whole")[
        "epoch-0001"
    ]


@pytest.fixture(scope="module")
def pytorch_run(generated, workdir) -> tuple[Path, str]:
    return stopped_run("pytorch", generated, workdir)


@pytest.fixture(scope="module")
def jax_run(generated, workdir) -> tuple[Path, str]:
    return stopped_run("jax", generated, workdir)


def resume(generated, framework: str, run: Path) -> subprocess.CompletedProcess:
    return reprocube(
        "train",
        f"framework={framework}",
        *generated.overrides(),
        *LOADER,
        f"run_name={run.name}",
        "resume=latest",
        cwd=run.parent.parent,
        check=False,
    )


def forge(run: Path, target: Path, edit) -> Path:
    """A copy of the run whose checkpoint's state.json was edited by `edit(loader_state)`, its sha256, size
    and the manifest's own digest recomputed: it verifies."""
    shutil.copytree(run, target)
    checkpoint = target / CHECKPOINT
    state = json.loads((checkpoint / "state.json").read_text())
    edit(state["loader"])
    blob = json.dumps(state).encode()
    (checkpoint / "state.json").write_bytes(blob)
    manifest = json.loads((checkpoint / "manifest.json").read_text())
    manifest["files"]["state.json"] = hashlib.sha256(blob).hexdigest()
    manifest["file_bytes"]["state.json"] = len(blob)
    manifest["manifest_sha256"] = manifest_self_digest(manifest)
    (checkpoint / "manifest.json").write_text(json.dumps(manifest))
    return target


def at(state: dict, *keys: str) -> dict:
    for key in keys:
        state = state[key]
    return state


def setter(keys: tuple[str, ...], key: str, value):
    return lambda state: at(state, *keys).__setitem__(key, value)


def deleter(keys: tuple[str, ...], key: str):
    return lambda state: at(state, *keys).pop(key)


# (case, edit of state.json "loader", what the error line must name)
TORCH_CASES = [
    ("sampler-next-minus-1", setter(TORCH_SAMPLER, "next", -1), "sampler_state.next is -1, not 160"),
    ("sampler-next-beyond-the-epoch", setter(TORCH_SAMPLER, "next", 10_000), "sampler_state.next is 10000"),
    ("sampler-epoch", setter(TORCH_SAMPLER, "epoch", 3), "sampler_state.epoch is 3, not 0"),
    ("worker-count-changed", setter(TORCH_MAIN, "_num_workers", 3), "_main_snapshot._num_workers is 3, not 2"),
    ("recorded-workers-changed", setter((), "workers", 3), "loader.torchdata._snapshot"),
    ("seed-2**70", setter(TORCH_MAIN, "_base_seed", 2**70), "_main_snapshot._base_seed is an integer of 71 bits"),
    ("seed-negative", setter(TORCH_MAIN, "_base_seed", -1), "_main_snapshot._base_seed is -1, outside"),
    ("yielded-count", setter(TORCH_MAIN, "_sampler_iter_yielded", 4), "_sampler_iter_yielded is 4, not 5"),
    ("missing-key", deleter(("torchdata", "_snapshot"), "_worker_snapshots"), "_snapshot._worker_snapshots is missing"),
    ("missing-worker", deleter(("torchdata", "_snapshot", "_worker_snapshots"), "worker_1"), "worker_1 is missing"),
    ("extra-key", setter(TORCH_MAIN, "_evil", 1), "_main_snapshot._evil is a key"),
    ("extra-worker", setter(("torchdata", "_snapshot", "_worker_snapshots"), "worker_2", {}), "worker_2 is a key"),
    ("extra-top-key", setter((), "order", [1, 2]), "loader.order is a key"),
    ("next-as-text", setter(TORCH_SAMPLER, "next", "160"), "sampler_state.next is a string, not an integer"),
    ("next-as-float", setter(TORCH_SAMPLER, "next", 160.0), "sampler_state.next is a number, not an integer"),
    ("finished-as-int", setter(("torchdata",), "_iterator_finished", 0), "_iterator_finished is an integer, not a"),
    ("snapshot-as-list", setter(("torchdata",), "_snapshot", []), "torchdata._snapshot is a list, not a JSON object"),
    ("workers-as-bool", setter((), "workers", True), "loader.workers is a boolean, not an integer"),
]
GRAIN_CASES = [
    ("index-out-of-range", setter(("grain", "last_seen_indices"), "0", 10**6), 'last_seen_indices."0" is 1000000'),
    ("index-moved-back", setter(("grain", "last_seen_indices"), "0", 0), 'last_seen_indices."0" is 0, not 4'),
    ("last-worker", setter(("grain",), "last_worker_index", 1), "grain.last_worker_index is 1, not 0"),
    ("worker-count-changed", setter(("grain",), "worker_count", 3), "grain.worker_count is 3, not 2"),
    ("missing-key", deleter(("grain",), "sampler"), "grain.sampler is missing"),
    ("missing-worker-index", deleter(("grain", "last_seen_indices"), "1"), 'last_seen_indices."1" is missing'),
    ("extra-key", setter(("grain",), "evil", 1), "grain.evil is a key"),
    ("extra-worker-index", setter(("grain", "last_seen_indices"), "2", 5), 'last_seen_indices."2" is a key'),
    ("index-as-text", setter(("grain", "last_seen_indices"), "0", "4"), 'last_seen_indices."0" is a string'),
    ("version-as-text", setter(("grain",), "version", "2"), "grain.version is a string, not an integer"),
    (
        "source-of-another-epoch",
        setter(("grain",), "data_source", "reprocube.EpochBatches(epoch=1, batches=0..10)"),
        "grain.data_source is",
    ),
]


def assert_refused(proc: subprocess.CompletedProcess, run: Path, named: str) -> None:
    assert "Traceback" not in proc.stderr, proc.stderr
    errors = [line for line in error_lines(proc) if line.startswith("reprocube: error:")]
    assert len(errors) == 1 and proc.returncode == 4, (proc.returncode, proc.stderr)
    assert f"checkpoint runs/{run.name}/{CHECKPOINT}: state.json loader." in errors[0], errors[0]
    assert named in errors[0], errors[0]


# The cases run through the CLI (one process each); every case is also checked in-process, against the state
# of the same genuine checkpoint.
CLI_CASES = {
    "pytorch": [
        "sampler-next-minus-1",
        "sampler-next-beyond-the-epoch",
        "worker-count-changed",
        "seed-2**70",
        "missing-key",
        "extra-key",
        "next-as-text",
    ],
    "jax": [
        "index-out-of-range",
        "index-moved-back",
        "worker-count-changed",
        "missing-key",
        "extra-key",
        "index-as-text",
    ],
}
ALL_CASES = {"pytorch": TORCH_CASES, "jax": GRAIN_CASES}


def cli_cases(framework: str) -> list:
    return [pytest.param(*c, id=c[0]) for c in ALL_CASES[framework] if c[0] in CLI_CASES[framework]]


def forged_case(generated, tmp_path, framework: str, stopped: Path, case: str, edit, named: str) -> None:
    run = forge(stopped, tmp_path / "runs" / f"{framework}-{case}", edit)
    assert_refused(resume(generated, framework, run), run, named)


@pytest.mark.process
@pytest.mark.parametrize("case, edit, named", cli_cases("pytorch"))
def test_a_forged_torchdata_state_is_refused_with_one_line(case, edit, named, generated, pytorch_run, tmp_path):
    forged_case(generated, tmp_path, "pytorch", pytorch_run[0], case, edit, named)


@pytest.mark.process
@pytest.mark.parametrize("case, edit, named", cli_cases("jax"))
def test_a_forged_grain_state_is_refused_with_one_line(case, edit, named, generated, jax_run, tmp_path):
    forged_case(generated, tmp_path, "jax", jax_run[0], case, edit, named)


@pytest.mark.process
@pytest.mark.parametrize("framework", ["pytorch", "jax"])
def test_every_forged_case_is_refused_by_the_schema_in_process(framework, request):
    from reprocube.data.loaders import jax, pytorch

    check_state = {"pytorch": pytorch.check_state, "jax": jax.check_state}[framework]
    genuine = json.loads((request.getfixturevalue(f"{framework}_run")[0] / CHECKPOINT / "state.json").read_text())
    check_state(copy.deepcopy(genuine["loader"]), 0, STOP, 320, 32, STEPS)
    for case, edit, named in ALL_CASES[framework]:
        state = copy.deepcopy(genuine["loader"])
        edit(state)
        with pytest.raises(CheckpointError) as refused:
            check_state(state, 0, STOP, 320, 32, STEPS)
        assert named in str(refused.value) and "state.json loader." in str(refused.value), (case, refused.value)


@pytest.mark.process
@pytest.mark.parametrize("framework", ["pytorch", "jax"])
def test_the_genuine_checkpoint_still_resumes_bit_exactly(framework, generated, request, tmp_path):
    stopped, whole = request.getfixturevalue(f"{framework}_run")
    state = json.loads((stopped / CHECKPOINT / "state.json").read_text())["loader"]
    assert (state["epoch"], state["step_in_epoch"], state["workers"]) == (0, STOP, 2)
    run = tmp_path / "runs" / stopped.name
    shutil.copytree(stopped, run)
    proc = resume(generated, framework, run)
    assert proc.returncode == 0 and not error_lines(proc), proc.stderr
    assert epoch_digests(run)["epoch-0001"] == whole


# --- in-process: the schema against states the libraries produce; the library's own errors -------------


def source(examples: int) -> ExampleSource:
    rng = np.random.default_rng(0)
    split = Split(rng.standard_normal((examples, 1, 28, 28), dtype=np.float32), np.arange(examples, dtype=np.int64))
    return ExampleSource(split, seed=3, augment=True, stateful_rng=False, background=-0.5)


def labels(batches) -> list[list[int]]:
    return [b[1].tolist() for b in batches]


@pytest.mark.parametrize("examples", [100, 96])  # a short last batch, and none
def test_torchdata_states_of_every_step_pass_and_resume_exactly(examples):
    from reprocube.data.loaders.pytorch import TorchDataPipeline

    order = np.random.default_rng(1).permutation(examples)
    steps = -(-examples // 32)
    whole = TorchDataPipeline(source(examples), 32, False, 0, 0)
    whole.start(2, order, 0, None)
    expected = labels(whole.next_batches(steps))
    for step in range(1, steps + 1):
        first = TorchDataPipeline(source(examples), 32, False, 0, 0)
        first.start(2, order, 0, None)
        first.next_batches(step)
        state = json.loads(json.dumps(first.state()))
        resumed = TorchDataPipeline(source(examples), 32, False, 0, 0)
        resumed.start(2, order, step, state)  # checked, then restored by torchdata
        assert labels(resumed.next_batches(steps - step)) == expected[step:], step
    # A loader started mid-epoch from the position (another worker count), stopped again and resumed with
    # its own state: torchdata's counts are its own, the sampler's the epoch's.
    restarted = TorchDataPipeline(source(examples), 32, False, 0, 0)
    restarted.start(2, order, 1, {"epoch": 2, "step_in_epoch": 1, "workers": 1, "torchdata": one_worker(examples)})
    restarted.next_batches(1)
    again = json.loads(json.dumps(restarted.state()))
    assert again["torchdata"]["_sampler_iter_yielded"] == 1
    resumed = TorchDataPipeline(source(examples), 32, False, 0, 0)
    resumed.start(2, order, 2, again)
    assert labels(resumed.next_batches(steps - 2)) == expected[2:]


def one_worker(examples: int) -> dict:
    """A genuine 1-worker state at step 1 of epoch 2 (batch 32), as torchdata writes it."""
    from reprocube.data.loaders.pytorch import torchdata_schema

    state = torchdata_schema(2, 1, examples, 32, 1, 1)
    state["_snapshot"]["_main_snapshot"]["_base_seed"] = 12345
    return state


def test_a_torchdata_error_on_a_state_the_schema_let_through_is_one_checkpoint_error(monkeypatch):
    from reprocube.data.loaders import pytorch

    order = np.arange(100)
    first = pytorch.TorchDataPipeline(source(100), 32, False, 0, 0)
    first.start(0, order, 0, None)
    first.next_batches(2)
    state = json.loads(json.dumps(first.state()))
    state["torchdata"]["_sampler_iter_state"]["sampler_state"]["next"] = 10**6  # past the epoch
    with pytest.raises(CheckpointError, match="sampler_state.next is 1000000"):
        pytorch.TorchDataPipeline(source(100), 32, False, 0, 0).start(0, order, 2, state)
    monkeypatch.setattr(pytorch, "check_state", lambda state, *args: state["workers"])  # no schema
    resumed = pytorch.TorchDataPipeline(source(100), 32, False, 0, 0)
    resumed.start(0, order, 2, state)
    with pytest.raises(CheckpointError, match=r"loader.torchdata was refused by .*StopIteration"):
        resumed.next_batches(1)  # torchdata: the sampler is exhausted at once
    broken = copy.deepcopy(state)
    broken["torchdata"]["_sampler_iter_state"]["sampler_state"] = None
    with pytest.raises(CheckpointError, match="loader.torchdata was refused by torchdata's StatefulDataLoader"):
        pytorch.TorchDataPipeline(source(100), 32, False, 0, 0).start(0, order, 2, broken)


def grain_state(step: int, workers: int, first: int = 0, steps: int = 4) -> dict:
    from reprocube.data.loaders.jax import grain_schema

    grain = grain_schema(0, step, steps, workers, first)
    return {"epoch": 0, "step_in_epoch": step, "workers": workers, "grain": grain}


def test_grain_states_pass_and_resume_exactly_also_after_a_restart_from_the_position():
    from reprocube.data.loaders.jax import GrainPipeline

    order = np.random.default_rng(1).permutation(100)
    whole = GrainPipeline(source(100), 32, False, 0, 0)
    whole.start(0, order, 0, None)
    expected = labels(whole.next_batches(4))
    for step in range(1, 5):
        first = GrainPipeline(source(100), 32, False, 0, 0)
        first.start(0, order, 0, None)
        first.next_batches(step)
        state = first.state()
        assert state == grain_state(step, 0)  # the schema is what Grain writes
        resumed = GrainPipeline(source(100), 32, False, 0, 0)
        resumed.start(0, order, step, json.loads(json.dumps(state)))
        assert labels(resumed.next_batches(4 - step)) == expected[step:], step
    # Stopped at step 1 with 1 worker, resumed with none (from the position), stopped again at step 2: its
    # source starts at batch 1, and resuming with its own state must use that source (Grain compares reprs).
    restarted = GrainPipeline(source(100), 32, False, 0, 0)
    restarted.start(0, order, 1, grain_state(1, 1))
    restarted.next_batches(1)
    again = json.loads(json.dumps(restarted.state()))
    assert again == grain_state(2, 0, first=1)
    resumed = GrainPipeline(source(100), 32, False, 0, 0)
    resumed.start(0, order, 2, again)
    assert labels(resumed.next_batches(2)) == expected[2:]


def test_a_grain_error_on_a_state_the_schema_let_through_is_one_checkpoint_error(monkeypatch):
    from reprocube.data.loaders import jax

    order = np.arange(100)
    state = grain_state(2, 0)
    state["grain"]["last_seen_indices"]["0"] = 10**6
    with pytest.raises(CheckpointError, match=r'last_seen_indices."0" is 1000000'):
        jax.GrainPipeline(source(100), 32, False, 0, 0).start(0, order, 2, state)
    monkeypatch.setattr(jax, "check_state", lambda state, *args: (state["workers"], 0))  # no schema
    with pytest.raises(CheckpointError, match=r"loader.grain was refused by Grain's DataLoader \(IndexError"):
        jax.GrainPipeline(source(100), 32, False, 0, 0).start(0, order, 2, state)
    state["grain"]["last_seen_indices"]["0"] = 3  # the last batch: Grain accepts it, then has none to give
    resumed = jax.GrainPipeline(source(100), 32, False, 0, 0)
    resumed.start(0, order, 2, state)
    with pytest.raises(CheckpointError, match=r"loader.grain was refused by Grain's DataLoader at the first batch"):
        resumed.next_batches(1)
    state["grain"]["last_seen_indices"] = {}
    with pytest.raises(CheckpointError, match=r"loader.grain was refused by Grain's DataLoader \(KeyError"):
        jax.GrainPipeline(source(100), 32, False, 0, 0).start(0, order, 2, state)


def test_the_position_keys_are_checked_exactly_and_name_the_checkpoint():
    where = "checkpoint /x/step-000005"
    check_position({"epoch": 0, "step_in_epoch": 5, "workers": 2}, 0, 5, where)
    for state, named in [
        ({"epoch": 0, "step_in_epoch": 4}, "loader.step_in_epoch is 4, not 5"),
        ({"epoch": False, "step_in_epoch": 5}, "loader.epoch is a boolean, not an integer"),
        ({"step_in_epoch": 5}, "loader.epoch is missing"),
    ]:
        with pytest.raises(CheckpointError, match=f"^{where}: state.json {named}"):
            check_position(state, 0, 5, where)
    with pytest.raises(CheckpointError, match="saves none at an epoch's start"):
        check_position({"epoch": 1, "step_in_epoch": 0}, 1, 0, where)
