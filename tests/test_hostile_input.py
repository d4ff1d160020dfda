"""Hostile input and faults (issue 15): every file reprocube reads may come from someone else, and every
directory it writes into may hold something. Each case prepares one bad input, runs the real CLI in a
fresh process and asserts: the documented exit status, exactly one `reprocube: error:` line on stderr
naming the file or key (warnings aside), no traceback, and every file that existed before unchanged."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save as save_safetensors

from reprocube.training.checkpoint import manifest_self_digest

from helpers import GeneratedDataset, encode_idx, error_lines, make_payloads, reprocube

TRAIN = ["framework=pytorch", "epochs=2", "log.every_steps=5", "log.progress=false"]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("hostile")


@pytest.fixture(scope="module")
def reference(generated, workdir) -> Path:
    reprocube("train", *TRAIN, *generated.overrides(), "run_name=reference", "checkpoint.every_steps=8", cwd=workdir)
    return workdir / "runs" / "reference"


@pytest.fixture
def run_copy(reference, tmp_path) -> Path:
    target = tmp_path / "runs" / "copy"
    shutil.copytree(reference, target)
    return target


def snapshot(root: Path) -> dict[str, str]:
    """Every entry under root (links not followed): a file's sha256, a link's target, a directory's mark."""
    entries = {}
    for path in sorted(root.rglob("*")):
        key = str(path.relative_to(root))
        if path.is_symlink():
            entries[key] = "link:" + os.readlink(path)
        elif path.is_file():
            entries[key] = hashlib.sha256(path.read_bytes()).hexdigest()
        elif path.is_dir():
            entries[key] = "dir"
        else:
            entries[key] = "special"
    return entries


def run_cli(*args, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    return subprocess.run(
        [sys.executable, "-m", "reprocube", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env
    )


def assert_refused(proc: subprocess.CompletedProcess, status: int, *named: str) -> str:
    """One error line naming every string of `named`, the exit status, no traceback; returns the line."""
    assert "Traceback" not in proc.stderr, proc.stderr
    errors = [line for line in error_lines(proc) if line.startswith("reprocube: error:")]
    assert len(errors) == 1, proc.stderr
    assert proc.returncode == status, (proc.returncode, proc.stderr)
    for text in named:
        assert text in errors[0], errors[0]
    return errors[0]


def resign(checkpoint: Path, **files: bytes) -> None:
    """Replace files of a checkpoint and recompute their sha256s and sizes and the manifest's own
    digest: what a careful forger (or a buggy tool) does, so that the content checks are reached."""
    manifest = json.loads((checkpoint / "manifest.json").read_text())
    for name, blob in files.items():
        (checkpoint / name).write_bytes(blob)
        manifest["files"][name] = hashlib.sha256(blob).hexdigest()
        manifest["file_bytes"][name] = len(blob)
    manifest["manifest_sha256"] = manifest_self_digest(manifest)
    (checkpoint / "manifest.json").write_text(json.dumps(manifest))


def edit_state(checkpoint: Path, edit) -> None:
    state = json.loads((checkpoint / "state.json").read_text())
    edit(state)
    resign(checkpoint, **{"state.json": json.dumps(state).encode()})


def edit_manifest(checkpoint: Path, edit) -> None:
    manifest = json.loads((checkpoint / "manifest.json").read_text())
    edit(manifest)
    manifest["manifest_sha256"] = manifest_self_digest(manifest)
    (checkpoint / "manifest.json").write_text(json.dumps(manifest))


def tensors(checkpoint: Path, name: str) -> dict[str, np.ndarray]:
    from safetensors.numpy import load

    return dict(load((checkpoint / name).read_bytes()))


def bf16_file(names: list[str]) -> bytes:
    """A valid safetensors file whose tensors are BF16 (NumPy has no such dtype)."""
    header, offset = {}, 0
    for name in names:
        header[name] = {"dtype": "BF16", "shape": [2], "data_offsets": [offset, offset + 4]}
        offset += 4
    blob = json.dumps(header).encode()
    return struct.pack("<Q", len(blob)) + blob + b"\0" * offset


# ---- a damaged or hostile checkpoint, given to resume=PATH: exit 4, nothing written ------------------------

CHECKPOINT_CASES = {
    "manifest with NaN": (lambda c: _raw_manifest(c, '"epoch": NaN'), "manifest.json"),
    "manifest with a 5000-digit integer": (lambda c: _raw_manifest(c, '"epoch": ' + "9" * 5000), "5000 digits"),
    "manifest nested 100k deep": (lambda c: _raw_manifest(c, '"epoch": ' + "[" * 100_000 + "]" * 100_000), "nested"),
    "state epoch a string": (lambda c: edit_state(c, lambda s: s["position"].update(epoch="1")), "epoch"),
    "state epoch null": (lambda c: edit_state(c, lambda s: s["position"].update(epoch=None)), "epoch"),
    "metrics.epochs: [1]": (lambda c: edit_manifest(c, lambda m: m["metrics"].update(epochs=[1])), "epochs[0]"),
    "an epoch record without global_step": (
        lambda c: edit_manifest(c, lambda m: m["metrics"]["epochs"][0].pop("global_step")),
        "global_step",
    ),
    "BF16 weights": (
        lambda c: resign(c, **{"weights.safetensors": bf16_file(sorted(tensors(c, "weights.safetensors")))}),
        "BF16",
    ),
    "an MT19937 array of length 3": (
        lambda c: resign(
            c,
            **{
                "rng.safetensors": save_safetensors(
                    {**tensors(c, "rng.safetensors"), "numpy.mt19937": np.zeros(3, np.uint32)}
                )
            },
        ),
        "numpy.mt19937",
    ),
    "epoch_totals.correct = 2**70": (
        lambda c: edit_state(c, lambda s: s["epoch_totals"].update(correct=2**70)),
        "correct",
    ),
    "rng.numpy.pos = 10**30": (lambda c: edit_state(c, lambda s: s["rng"]["numpy"].update(pos=10**30)), "rng"),
    # Version 3 writes every key: one missing is named (an older version's file is upgraded instead).
    "state version 3 without sessions": (lambda c: edit_state(c, lambda s: s.pop("sessions")), "lacks sessions"),
    "integer momentum buffers": (
        lambda c: resign(
            c,
            **{
                "optimizer.safetensors": save_safetensors(
                    {k: v.astype(np.int32) for k, v in tensors(c, "optimizer.safetensors").items()}
                )
            },
        ),
        "int32",
    ),
    "NaN weights": (
        lambda c: _nan_weights(c),
        "NaN",
    ),
    "a listed file that is a directory": (
        lambda c: _replace_with_directory(c, "optimizer.safetensors"),
        "not a regular file",
    ),
    "a listed file linked to /dev/zero": (
        lambda c: _replace_with_link(c, "optimizer.safetensors", "/dev/zero"),
        "symbolic link",
    ),
    "a listed file that is a FIFO": (lambda c: _replace_with_fifo(c, "optimizer.safetensors"), "not a regular file"),
    "config.json not matching config_hash": (
        lambda c: resign(
            c, **{"config.json": json.dumps({**json.loads((c / "config.json").read_text()), "seed": 7}).encode()}
        ),
        "config_hash",
    ),
}


def _raw_manifest(checkpoint: Path, replacement: str) -> None:
    text = (checkpoint / "manifest.json").read_text()
    (checkpoint / "manifest.json").write_text(text.replace('"epoch": 1', replacement, 1))


def _nan_weights(checkpoint: Path) -> None:
    weights = tensors(checkpoint, "weights.safetensors")
    weights["fc2.bias"] = np.full_like(weights["fc2.bias"], np.nan)
    resign(checkpoint, **{"weights.safetensors": save_safetensors(weights)})
    from reprocube.training.checkpoint import weights_digest

    edit_manifest(checkpoint, lambda m: m.update(weights_digest=weights_digest(weights)))


def _replace_with_directory(checkpoint: Path, name: str) -> None:
    (checkpoint / name).unlink()
    (checkpoint / name).mkdir()


def _replace_with_link(checkpoint: Path, name: str, target: str) -> None:
    (checkpoint / name).unlink()
    (checkpoint / name).symlink_to(target)


def _replace_with_fifo(checkpoint: Path, name: str) -> None:
    (checkpoint / name).unlink()
    os.mkfifo(checkpoint / name)


@pytest.mark.process
@pytest.mark.parametrize("case", sorted(CHECKPOINT_CASES))
def test_a_hostile_checkpoint_is_refused_in_one_line_and_nothing_is_written(case, run_copy, generated, tmp_path):
    damage, named = CHECKPOINT_CASES[case]
    checkpoint = run_copy / "checkpoints" / "epoch-0001"
    damage(checkpoint)
    before = snapshot(tmp_path)
    proc = run_cli("train", *TRAIN, *generated.overrides(), f"resume={checkpoint}", "run_name=resumed", cwd=tmp_path)
    assert_refused(proc, 4, named)
    assert snapshot(tmp_path) == before  # no run directory, nothing changed


@pytest.mark.process
@pytest.mark.parametrize(
    "case", ["a listed file that is a FIFO", "config.json not matching config_hash", "BF16 weights"]
)
def test_compare_names_an_unreadable_checkpoint_and_goes_on(case, run_copy, reference, tmp_path):
    damage, _ = CHECKPOINT_CASES[case]
    damage(run_copy / "checkpoints" / "epoch-0001")
    out = tmp_path / "out"
    proc = run_cli("compare", str(reference), str(run_copy), "--out", str(out), cwd=tmp_path, timeout=60)
    assert "Traceback" not in proc.stderr and proc.returncode == 6, proc.stderr
    warnings = [line for line in error_lines(proc) if line.startswith("reprocube: warning:")]
    assert len(warnings) == 1 and "epoch-0001" in warnings[0]
    assert "not verified: unreadable checkpoints B:epoch-0001" in proc.stdout
    assert json.loads((out / "compare.json").read_text())["unreadable_checkpoints"] == {"a": [], "b": ["epoch-0001"]}


@pytest.mark.process
def test_a_version_2_state_without_its_later_keys_is_read_as_what_their_absence_meant(run_copy):
    """state.json version 2, as written before "trace", "loader" and "sessions" existed: upgraded in one
    place (state._upgraded) and read; the same object claiming version 3 is refused, naming the key."""
    from reprocube.errors import CheckpointError
    from reprocube.training.checkpoint import read_checkpoint
    from reprocube.training.state import TrainState

    checkpoint = run_copy / "checkpoints" / "epoch-0001"
    steps_per_epoch = json.loads((checkpoint / "manifest.json").read_text())["steps_per_epoch"]
    written = TrainState.from_checkpoint(read_checkpoint(checkpoint), steps_per_epoch)
    assert written.trace is not None and written.sessions and written.loader is None

    def as_version(version):
        return lambda s: [s.pop(key) for key in ("trace", "loader", "sessions")] and s.update(version=version)

    edit_state(checkpoint, as_version(2))
    older = TrainState.from_checkpoint(read_checkpoint(checkpoint), steps_per_epoch)
    assert (older.trace, older.loader, older.sessions) == (None, None, None)
    assert older.position == written.position and older.epoch_totals == written.epoch_totals
    edit_state(checkpoint, lambda s: s.update(version=3))
    with pytest.raises(CheckpointError, match="state.json version 3 lacks trace"):
        TrainState.from_checkpoint(read_checkpoint(checkpoint), steps_per_epoch)
    # A version-2 file never held null there: refused, as version 2's reader refused it.
    edit_state(checkpoint, lambda s: s.update(version=2, loader=None))
    with pytest.raises(CheckpointError, match="state.json loader is null, which version 2 never writes"):
        TrainState.from_checkpoint(read_checkpoint(checkpoint), steps_per_epoch)


# ---- resume=auto past a damaged newest checkpoint -------------------------------------------------------------


@pytest.mark.process
def test_resume_auto_sets_a_damaged_checkpoint_aside_and_resumes_from_the_newest_good_one(
    run_copy, reference, generated
):
    """A truncated manifest in the newest mid-epoch checkpoint must not stop a requeued job: it is moved
    aside (kept), and the run resumes from the newest good checkpoint and ends bit-identical."""
    checkpoints = run_copy / "checkpoints"
    for late in ("epoch-0002", "step-000040"):
        shutil.rmtree(checkpoints / late)  # the run was stopped after step 32 (steps of 21 per epoch)
    (checkpoints / "step-000032" / "manifest.json").write_text('{"format_version": 1, "fil')
    proc = reprocube(
        "train",
        *TRAIN,
        *generated.overrides(),
        "run_name=copy",
        "resume=auto",
        "checkpoint.every_steps=8",
        cwd=run_copy.parents[1],
    )
    warnings = [line for line in error_lines(proc) if line.startswith("reprocube: warning:")]
    assert len(warnings) == 1 and "step-000032" in warnings[0] and ".unreadable-step-000032" in warnings[0]
    assert (checkpoints / ".unreadable-step-000032" / "manifest.json").read_text() == '{"format_version": 1, "fil'
    assert "resumed from" in proc.stdout and "step-000024" in proc.stdout
    digest = lambda run: json.loads((run / "checkpoints" / "epoch-0002" / "manifest.json").read_text())[
        "weights_digest"
    ]
    assert digest(run_copy) == digest(reference)


# ---- writes: never over someone else's directory, never through a link, never into checkpoints/ ---------------


@pytest.mark.process
def test_a_directory_that_is_not_a_run_is_never_overwritten(generated, tmp_path):
    foreign = tmp_path / "runs" / "mine"
    foreign.mkdir(parents=True)
    for name in ("config.yaml", "metrics.jsonl", "env.json", "sessions.jsonl"):
        (foreign / name).write_text(f"my own {name}\n")
    before = snapshot(tmp_path)
    proc = run_cli("train", *TRAIN, *generated.overrides(), "run_name=mine", cwd=tmp_path)
    assert_refused(proc, 2, "is not a reprocube run")
    assert snapshot(tmp_path) == before


@pytest.mark.process
def test_sessions_jsonl_is_never_written_through_a_link(run_copy, generated, tmp_path):
    target = tmp_path / "precious.txt"
    target.write_text("keep me\n")
    sessions = run_copy / "sessions.jsonl"
    sessions.unlink()
    sessions.symlink_to(target)
    before = snapshot(tmp_path)
    proc = run_cli(
        "train", *TRAIN, *generated.overrides(), "epochs=3", "run_name=copy", "resume=latest", cwd=run_copy.parents[1]
    )
    assert_refused(proc, 2, "sessions.jsonl", "symbolic link")
    assert target.read_text() == "keep me\n" and snapshot(tmp_path) == before


@pytest.mark.process
@pytest.mark.parametrize("command", ["compare", "report"])
def test_no_report_is_written_inside_a_runs_checkpoints(command, reference, run_copy, tmp_path):
    inside = run_copy / "checkpoints" / "epoch-0002"
    before = snapshot(run_copy)
    args = ["compare", str(reference), str(run_copy)] if command == "compare" else ["report", str(run_copy)]
    proc = run_cli(*args, "--out", str(inside), cwd=tmp_path)
    assert_refused(proc, 2, "inside a run's checkpoints/")
    assert snapshot(run_copy) == before


# ---- run files and results read by compare and report: exit 4, one line --------------------------------------


@pytest.mark.process
@pytest.mark.parametrize(
    "content", ["garbage", "[]", '{"checks": [1]}', '{"checks": [{"check": "x", "passed": "yes", "summary": "s"}]}']
)
def test_report_refuses_a_malformed_verify_json(content, run_copy, tmp_path):
    (run_copy / "verify.json").write_text(content)
    proc = run_cli("report", str(run_copy), "--out", str(tmp_path / "report"), cwd=tmp_path)
    assert_refused(proc, 4, "verify.json")
    assert not (tmp_path / "report").exists()


@pytest.mark.process
@pytest.mark.parametrize(
    "record", ['{"kind": "epoch", "epoch": [1]}', '{"kind": "step", "epoch": 1}', "NaN", '{"kind": "other"}', "{"]
)
@pytest.mark.parametrize("command", ["compare", "report"])
def test_compare_and_report_refuse_a_malformed_metrics_record(command, record, reference, run_copy, tmp_path):
    with open(run_copy / "metrics.jsonl", "a") as f:
        f.write(record + "\n")
    args = (
        ["compare", str(reference), str(run_copy), "--out", str(tmp_path / "o")]
        if command == "compare"
        else ["report", str(run_copy), "--out", str(tmp_path / "o")]
    )
    proc = run_cli(*args, cwd=tmp_path)
    assert_refused(proc, 4, "metrics.jsonl")
    assert not (tmp_path / "o").exists()


@pytest.mark.process
@pytest.mark.parametrize("study", ["[]", '{"groups": {"same_seed": 1}, "runs": []}', '{"groups": {}, "runs": [1]}'])
def test_report_refuses_a_malformed_study_json(study, tmp_path):
    directory = tmp_path / "study"
    directory.mkdir()
    (directory / "study.json").write_text(study)
    proc = run_cli("report", str(directory), "--out", str(tmp_path / "report"), cwd=tmp_path)
    assert_refused(proc, 4, "study.json")


@pytest.mark.process
def test_a_large_metrics_file_is_streamed(reference, run_copy, tmp_path):
    """100 MB of step records: compare reads them as a stream (the memory of the epoch records only)."""
    line = json.dumps({"kind": "step", "epoch": 1, "global_step": 1, "loss": 0.5}) + "\n"
    with open(run_copy / "metrics.jsonl", "a") as f:
        f.write(line * (100_000_000 // len(line)))
    # VmHWM, not ru_maxrss: a child of fork or vfork and exec carries its parent's resident size into
    # ru_maxrss, and this test's parent is a pytest worker that may hold a gigabyte (it failed so once).
    probe = (
        "import sys; from reprocube.cli import main; status = main(sys.argv[1:]); "
        "hwm = next(line for line in open('/proc/self/status') if line.startswith('VmHWM:')); "
        "print('peak_mb', int(hwm.split()[1]) // 1024); sys.exit(status)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", probe, "compare", str(reference), str(run_copy), "--out", str(tmp_path / "o")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    peak_mb = int(proc.stdout.split("peak_mb")[-1])
    assert peak_mb < 600, peak_mb  # was 1.2 GB with the whole file in memory; the process itself is ~300 MB


# ---- configuration and data ------------------------------------------------------------------------------------


@pytest.mark.process
@pytest.mark.parametrize(
    "args, yaml_text, named",
    [
        (["--print-config", "=3"], None, "'=3': an override is KEY=VALUE"),
        ([], "optimizer: 5\n", "optimizer must be a mapping"),
        ([], b"seed: \xff\xfe\n", "not UTF-8"),
        ([], 'run_name: "a\\0b"\n', "run_name"),
        ([], 'output_dir: "runs\\0x"\n', "output_dir"),
        (["threads=1099511627776"], None, "threads"),
        (["run_name=' '"], None, "run_name"),
        (["run_name=${oc.decode:'[1,2]'}"], None, "run_name"),
        (["run_name=ünï😀"], None, "run_name"),
        (
            [],
            "a: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\nc: [*b, *b, *b]\n",
            "aliases",
        ),
    ],
)
def test_a_bad_configuration_is_one_line_with_exit_2(args, yaml_text, named, generated, tmp_path):
    extra = []
    if yaml_text is not None:
        path = tmp_path / "user.yaml"
        path.write_bytes(yaml_text if isinstance(yaml_text, bytes) else yaml_text.encode())
        extra = ["--config-file", str(path)]
    before = snapshot(tmp_path)
    proc = run_cli("train", *extra, *args, *TRAIN, *generated.overrides(), cwd=tmp_path, timeout=60)
    assert_refused(proc, 2, named)
    assert snapshot(tmp_path) == before


@pytest.mark.process
def test_more_threads_than_cpus_is_warned_about(generated, tmp_path):
    proc = run_cli("train", *TRAIN, *generated.overrides(), "epochs=1", "threads=64", cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert any(line.startswith("reprocube: warning: threads=64") for line in error_lines(proc))


@pytest.mark.process
@pytest.mark.parametrize("damage", ["directory", "link to /dev/zero"])
def test_a_data_file_that_is_not_a_regular_file_is_refused(damage, generated, tmp_path):
    data = tmp_path / "data"
    shutil.copytree(generated.data_dir, data)
    target = data / "generated" / "train-images-idx3-ubyte"
    target.unlink()
    if damage == "directory":
        target.mkdir()
    else:
        target.symlink_to("/dev/zero")
    overrides = [o if not o.startswith("data_dir=") else f"data_dir={data}" for o in generated.overrides()]
    proc = run_cli("train", *TRAIN, *overrides, cwd=tmp_path)
    assert_refused(proc, 3, "train-images-idx3-ubyte", "not a regular file")


@pytest.mark.process
def test_images_that_are_not_28x28_are_refused_as_data(tmp_path):
    payloads = make_payloads(train=64, test=32)
    payloads["train_images"] = encode_idx(np.zeros((64, 10, 10), np.uint8))
    payloads["test_images"] = encode_idx(np.zeros((32, 10, 10), np.uint8))
    dataset = GeneratedDataset(tmp_path / "data", payloads)
    dataset.write_raw()
    proc = run_cli("train", *TRAIN, *dataset.overrides(), cwd=tmp_path)
    assert_refused(proc, 3, "28x28")


# ---- verdicts and reports ------------------------------------------------------------------------------------


@pytest.mark.process
def test_verify_refuses_a_reference_made_under_another_config_up_front(reference, generated, tmp_path):
    proc = run_cli("verify", *TRAIN, *generated.overrides(), f"run={reference}", "optimizer.lr=0.05", cwd=tmp_path)
    assert_refused(proc, 2, "optimizer.lr: 0.01 -> 0.05")
    assert not (tmp_path / "runs").exists()


@pytest.mark.process
@pytest.mark.parametrize("tolerance", ["nan", "inf", "-1"])
def test_compare_refuses_a_tolerance_that_is_not_a_finite_number(tolerance, reference, tmp_path):
    proc = run_cli(
        "compare", str(reference), str(reference), "--tolerance", tolerance, "--out", str(tmp_path / "o"), cwd=tmp_path
    )
    assert_refused(proc, 2, "--tolerance")


@pytest.mark.process
def test_compare_names_a_tensor_only_one_run_has(run_copy, reference, tmp_path):
    checkpoint = run_copy / "checkpoints" / "epoch-0002"
    weights = tensors(checkpoint, "weights.safetensors")
    weights["extra.weight"] = np.zeros(2, np.float32)
    resign(checkpoint, **{"weights.safetensors": save_safetensors(weights)})
    from reprocube.training.checkpoint import weights_digest

    edit_manifest(checkpoint, lambda m: m.update(weights_digest=weights_digest(weights)))
    proc = run_cli("compare", str(reference), str(run_copy), "--out", str(tmp_path / "o"), cwd=tmp_path)
    assert proc.returncode == 6 and "None" not in proc.stdout, proc.stdout
    assert "extra.weight: only in run B" in proc.stdout


@pytest.mark.process
def test_the_first_signal_names_the_stop(generated, tmp_path):
    """SLURM sends USR1 as its warning, then TERM at the deadline: the stop is a USR1 stop."""
    hook = (
        "import os, signal, sys\n"
        "import reprocube.training.loop as loop\n"
        "original = loop.Schedule.group_end\n"
        "def twice(self, position):\n"
        "    if position.global_step == 3:\n"
        "        os.kill(os.getpid(), signal.SIGUSR1); os.kill(os.getpid(), signal.SIGTERM)\n"
        "    return original(self, position)\n"
        "loop.Schedule.group_end = twice\n"
        "from reprocube.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", hook, "train", *TRAIN, *generated.overrides(), "log.every_steps=1"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 75, proc.stderr
    assert "stopped by SIGUSR1" in proc.stdout


# ---- found in review: legitimate input accepted, and no resume ever starts a damaged run again --------------


@pytest.mark.process
def test_resume_auto_with_every_checkpoint_damaged_stops_and_changes_nothing(run_copy, generated, tmp_path):
    for checkpoint in (run_copy / "checkpoints").iterdir():
        (checkpoint / "manifest.json").write_text("{")
    before = snapshot(tmp_path)
    proc = run_cli(
        "train",
        *TRAIN,
        *generated.overrides(),
        "run_name=copy",
        "resume=auto",
        "checkpoint.every_steps=8",
        cwd=tmp_path,
    )
    assert_refused(proc, 4, "no usable checkpoint")
    assert snapshot(tmp_path) == before  # neither set aside nor started again from scratch


@pytest.mark.process
def test_resume_of_the_only_checkpoint_when_its_manifest_is_damaged_is_one_line(run_copy, generated, tmp_path):
    for late in ("epoch-0002", "step-000040", "step-000032", "step-000024", "epoch-0001", "step-000016"):
        shutil.rmtree(run_copy / "checkpoints" / late)
    (run_copy / "checkpoints" / "step-000008" / "manifest.json").write_text("{")
    proc = run_cli(
        "train",
        *TRAIN,
        *generated.overrides(),
        "run_name=copy",
        f"resume={run_copy}/checkpoints/step-000008",
        cwd=tmp_path,
    )
    assert "Traceback" not in proc.stderr and proc.returncode in (2, 4), proc.stderr


def test_an_unrelated_manifest_json_above_the_output_is_not_a_checkpoint(tmp_path):
    from reprocube.files import refuse_inside_checkpoints

    (tmp_path / "manifest.json").write_text("{}")  # a project's own manifest, not a checkpoint's
    refuse_inside_checkpoints(tmp_path / "reports" / "out")  # no error


def test_a_study_result_without_its_fields_is_a_failure_not_a_traceback(tmp_path):
    from reprocube.orchestration.study_members import collect, study_paths

    for directory in study_paths(tmp_path).values():
        directory.mkdir(parents=True)
    (tmp_path / "results" / "same-seed-00.json").write_text('{"status": "failed"}')
    result = collect(tmp_path, runs=2, seed=0)
    [failure] = [f for f in result["failures"] if f["member"] == 0]
    assert "unreadable result" in failure["error"] and "member" in failure["error"]


def test_a_null_step_loss_of_a_diverging_run_is_a_valid_record(tmp_path):
    from reprocube.training.metrics import read_epoch_records

    (tmp_path / "metrics.jsonl").write_text('{"kind": "step", "epoch": 1, "global_step": 5, "loss": null}\n')
    assert read_epoch_records(tmp_path / "metrics.jsonl") == []
