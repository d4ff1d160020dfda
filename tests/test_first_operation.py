"""The first diverging operation (issue 26): replay_step records every operation of one step of a run
(OPS.json); reprocube.analysis.first_differing_operation reads it strictly and names the first operation that differs
between two recordings."""

from __future__ import annotations

import copy
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from reprocube.analysis.first_differing_operation import first_differing_operation
from reprocube.config import config_hash
from reprocube.errors import CheckpointError
from reprocube.formats.ops_format import read_ops
from reprocube.orchestration.operation_replay import nondeterministic_operation
from reprocube.training.checkpoint import manifest_self_digest

from helpers import reprocube


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def op(index: int, name: str, inputs=("x", "w"), outputs=("y",), where="forward, conv1", params="p") -> dict:
    return {
        "index": index,
        "op": name,
        "where": where,
        "params": digest(params),
        "inputs": [digest(i) for i in inputs],
        "outputs": [digest(o) for o in outputs],
    }


def recording(ops: list[dict], step: int = 6) -> dict:
    return {
        "version": 1,
        "framework": "pytorch",
        "step": step,
        "run": "runs/a",
        "resumed_from": "step-000005",
        "start_step": step - 1,
        "framework_info": {"name": "pytorch", "num_threads": 2, "mkldnn": True, "onednn": None},
        "env_vars": {},
        "loss_f32": "400f2fde",
        "run_loss_f32": "400f2fde",
        "loss_matches_run": True,
        "weights_match_run": None,
        "recording_changed_nothing": True,
        "ops": ops,
    }


A = [
    op(0, "aten.index_select.default", ("data", "order"), ("batch",), "batch"),
    op(1, "aten.convolution.default", ("batch", "w1", "b1"), ("c1",)),
    op(2, "aten.relu.default", ("c1",), ("r1",), "forward, model"),
    op(
        3,
        "aten.convolution_backward.default",
        ("g", "batch", "w1"),
        ("gi", "gw", "gb"),
        "backward, conv1 (ConvolutionBackward0)",
    ),
]


def test_equal_recordings_have_no_differing_operation():
    assert first_differing_operation(recording(A), recording(copy.deepcopy(A))) is None


def test_an_operation_whose_inputs_agree_and_output_differs_is_named():
    b = copy.deepcopy(A)
    b[3] = op(
        3,
        "aten.convolution_backward.default",
        ("g", "batch", "w1"),
        ("gi", "gw*", "gb"),
        "backward, conv1 (ConvolutionBackward0)",
    )
    found = first_differing_operation(recording(A), recording(b))
    assert found["index"] == 3 and found["kind"] == "output" and found["inputs_equal"] is True
    assert found["op"] == "aten.convolution_backward.default" and found["differing_outputs"] == [1]
    assert found["text"] == (
        "convolution backward (aten.convolution_backward.default) in backward, conv1 (ConvolutionBackward0): "
        "inputs equal, output 1 of 3 differs"
    )


def test_a_random_operation_is_said_to_depend_on_its_generator():
    a = [op(0, "aten.bernoulli_.float", ("m",), ("m",), "forward, conv2_drop")]
    b = [op(0, "aten.bernoulli_.float", ("m",), ("m*",), "forward, conv2_drop")]
    found = first_differing_operation(recording(a), recording(b))
    assert found["random"] is True and "generator state" in found["text"]


def test_differing_inputs_point_before_the_step():
    b = copy.deepcopy(A)
    b[1] = op(1, "aten.convolution.default", ("batch", "w1*", "b1"), ("c1*",))
    found = first_differing_operation(recording(A), recording(b))
    assert found["kind"] == "inputs" and found["inputs_equal"] is False and found["differing_inputs"] == [1]
    assert "input 1 of 3 differs" in found["text"] and "entering step 6 differs" in found["text"]
    far = recording(b, step=9)
    far["start_step"] = 5
    assert "record step 6" in first_differing_operation(recording(A, step=9), far)["text"]


def test_differing_arguments_are_told_apart():
    b = copy.deepcopy(A)
    b[2] = op(2, "aten.relu.default", ("c1",), ("r1",), "forward, model", params="other")
    found = first_differing_operation(recording(A), recording(b))
    assert found["kind"] == "params" and found["params_equal"] is False and found["inputs_equal"] is True


def test_diverging_operation_sequences():
    b = copy.deepcopy(A)
    b[2] = op(2, "aten.clamp_min.default", ("c1",), ("r1",), "forward, model")
    found = first_differing_operation(recording(A), recording(b))
    assert found["kind"] == "sequence" and found["index"] == 2
    assert (found["op"], found["b_op"]) == ("aten.relu.default", "aten.clamp_min.default")
    assert "sequences diverge at operation 2" in found["text"]
    ended = first_differing_operation(recording(A), recording(copy.deepcopy(A[:3])))
    assert ended["kind"] == "sequence" and ended["index"] == 3 and ended["b_op"] is None
    assert "B runs nothing" in ended["text"]
    with pytest.raises(ValueError, match="different steps"):
        first_differing_operation(recording(A), recording(A, step=7))


def jax_recording(ops: list[dict], step: int = 6) -> dict:
    return recording(ops, step) | {"framework": "jax"}


JAX_OPS = [
    op(0, "reprocube.step_input", ("k1",), (), "step input params.conv1.kernel"),
    op(1, "reprocube.step_input", ("k2",), (), "step input params.fc2.kernel"),
    op(2, "jax.conv_general_dilated", ("batch", "k1"), ("c1",)),
    op(3, "jax.dot_general", ("h", "k2"), ("logits",), "forward, fc2"),
    op(4, "jax.dot_general", ("g", "h"), ("gk2",), "backward, fc2"),
]


def test_jax_a_differing_step_input_is_the_state_entering_the_step():
    b = copy.deepcopy(JAX_OPS)
    b[1] = op(1, "reprocube.step_input", ("k2*",), (), "step input params.fc2.kernel")
    found = first_differing_operation(jax_recording(JAX_OPS), jax_recording(b))
    assert found["kind"] == "inputs" and found["index"] == 1
    assert found["text"] == "the state or data entering step 6 differs, first at step input params.fc2.kernel"
    at_start = first_differing_operation(jax_recording(JAX_OPS, step=1), jax_recording(b, step=1) | {"start_step": 0})
    assert at_start["text"].endswith("params.fc2.kernel (the initial weights: the initialisation computed differently)")


def test_jax_a_kernel_input_that_differs_points_at_an_unrecorded_operation_before_it():
    """JAX records kernels only: a kernel's input that differs when the step's inputs and earlier kernels
    agree was computed by an operation between them (fused elementwise work), not before the step."""
    b = copy.deepcopy(JAX_OPS)
    b[4] = op(4, "jax.dot_general", ("g*", "h"), ("gk2*",), "backward, fc2")
    found = first_differing_operation(jax_recording(JAX_OPS), jax_recording(b))
    assert found["kind"] == "inputs" and found["op"] == "jax.dot_general" and found["where"] == "backward, fc2"
    assert "an operation between them that is not recorded" in found["text"]
    assert "entering step" not in found["text"]


# --- a non-deterministic B: its step recorded twice (the children faked: their recordings given) -------
def replays_giving(*recordings: dict, status: int = 0):
    """A run_child for nondeterministic_operation that writes the given recordings, one per replay."""
    given = iter(recordings)

    def run_child(command: list[str], log: Path, env: dict | None) -> int:
        assert env is None  # both replays as B runs it, in this environment
        log.write_text("reprocube: error: the replay broke\n" if status else "")
        if status == 0:
            Path(command[command.index("--out") + 1]).write_text(json.dumps(next(given)))
        return status

    return run_child


def nondeterministic(tmp_path: Path, run_child) -> dict:
    return nondeterministic_operation("pytorch", 6, tmp_path / "b", tmp_path / "ops", tmp_path, [], run_child)


def test_a_non_deterministic_operation_of_b_is_named_from_two_recordings_of_its_step(tmp_path):
    again = copy.deepcopy(A)
    again[3] = op(
        3,
        "aten.convolution_backward.default",
        ("g", "batch", "w1"),
        ("gi", "gw*", "gb"),
        "backward, conv1 (ConvolutionBackward0)",
    )
    # Neither replay gives B's loss bits: a non-deterministic step need not; the same inputs are what count.
    first, second = recording(A) | {"loss_matches_run": False}, recording(again) | {"loss_matches_run": False}
    found = nondeterministic(tmp_path, replays_giving(first, second))
    assert (found["status"], found["step"], found["index"], found["inputs_equal"]) == ("found", 6, 3, True)
    assert found["text"] == (
        "first non-deterministic operation (step 6 recorded twice as B runs it, operation 4 of 4): convolution "
        "backward (aten.convolution_backward.default) in backward, conv1 (ConvolutionBackward0): inputs equal, "
        "output 1 of 3 differs"
    )
    assert [Path(r).name for r in found["recordings"]] == ["step-6-b.json", "step-6-b-again.json"]


def test_two_equal_recordings_of_a_non_deterministic_b_name_no_operation(tmp_path):
    within = recording(A) | {"recording_changed_nothing": False}
    found = nondeterministic(tmp_path, replays_giving(recording(A), within))
    assert found["status"] == "none" and "the non-determinism did not recur" in found["text"]
    assert "within the replay as b-again, computing the step a second time gave other bits" in found["text"]
    # A replay that fails is said with its own line, no operation named.
    failed = nondeterministic(tmp_path, replays_giving(status=4))
    assert failed["status"] == "failed" and failed["text"] == (
        "first non-deterministic operation: the replay as b exited 4: reprocube: error: the replay broke"
    )


def write(tmp_path: Path, value, name="ops.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(value) if not isinstance(value, str) else value)
    return path


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda r: r.pop("loss_matches_run"), "loss_matches_run is missing"),
        (lambda r: r.update(extra=1), "unknown key 'extra'"),
        (lambda r: r.update(version=2), "version 2"),
        (lambda r: r.update(step=0), "step must be an integer from 1"),
        (lambda r: r.update(start_step=6), "start_step must be before step"),
        (lambda r: r.update(loss_f32="400f2fdX"), "loss_f32 must be 8 hex digits"),
        (lambda r: r.update(recording_changed_nothing=None), "recording_changed_nothing must be true or false"),
        (lambda r: r["framework_info"].update(x=[1]), "framework_info.x"),
        (lambda r: r["ops"][1].update(index=5), "index must be 1"),
        (lambda r: r["ops"][1].update(op="aten.conv; rm"), "an operation name"),
        (lambda r: r["ops"][1]["outputs"].append("nothex"), "16-hex digests"),
        (lambda r: r["ops"][1].pop("params"), "params is missing"),
        (lambda r: r["ops"].append("op"), "is not a JSON object"),
        (lambda r: r.update(ops={}), "ops must be a list"),
    ],
)
def test_the_reader_refuses_malformed_recordings(tmp_path, edit, message):
    value = recording(copy.deepcopy(A))
    assert read_ops(write(tmp_path, value)) == value
    edit(value)
    with pytest.raises(CheckpointError, match=message) as caught:
        read_ops(write(tmp_path, value))
    assert "\n" not in str(caught.value)


def test_the_reader_refuses_what_is_no_regular_bounded_json_file(tmp_path, monkeypatch):
    good = write(tmp_path, recording(A))
    for bad, message in [
        (write(tmp_path, '{"version": NaN}', "nan.json"), "NaN"),
        (write(tmp_path, '{"a": 1, "a": 2}', "dup.json"), "twice"),
        (write(tmp_path, "[1]", "list.json"), "not a JSON object"),
        (tmp_path, "not a regular file"),
        (tmp_path / "missing.json", "missing"),
    ]:
        with pytest.raises(CheckpointError, match=message):
            read_ops(bad)
    link = tmp_path / "link.json"
    link.symlink_to(good)
    with pytest.raises(CheckpointError, match="symbolic link"):
        read_ops(link)
    monkeypatch.setattr("reprocube.formats.ops_format.MAX_OPS_BYTES", 100)
    with pytest.raises(CheckpointError, match="more than the 100 allowed"):
        read_ops(good)


# --- end to end: a PyTorch run, its step replayed in fresh processes ------------------------------------
def replay_step(run: Path, step: int, out: Path, cwd: Path, env_extra: dict | None = None):
    env = {**os.environ, "PYTHONHASHSEED": "0", **(env_extra or {})}
    command = [
        sys.executable,
        "-m",
        "reprocube.orchestration.replay_step",
        "--run",
        str(run),
        "--step",
        str(step),
        "--out",
        str(out),
    ]
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=300, env=env)


def train_run(framework: str, generated, where: Path) -> Path:
    """One epoch (21 steps) with a step checkpoint every 5 steps and weight digests every 3."""
    reprocube(
        "train",
        f"framework={framework}",
        *generated.overrides(),
        "epochs=1",
        "checkpoint.every_steps=5",
        "trace.every_steps=3",
        f"output_dir={where}",
        "run_name=a",
        cwd=where,
    )
    return where / "a"


@pytest.fixture(scope="module")
def pytorch_run(generated, tmp_path_factory) -> Path:
    return train_run("pytorch", generated, tmp_path_factory.mktemp("runs"))


def tree(directory: Path) -> dict[str, str]:
    return {
        str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
        for p in sorted(directory.rglob("*"))
    }


@pytest.mark.process
def test_replayed_steps_agree_and_another_isa_names_its_first_operation(pytorch_run, tmp_path):
    """Replays of one step agree op for op and match the run's loss; under ONEDNN_MAX_CPU_ISA=SSE41
    (which changes PyTorch's CPU results on this project's AVX2 and AVX-512 machines) an operation whose
    inputs agree computes differently, and it is named. Which one is not asserted: it depends on the
    oneDNN kernels each machine has (here, AVX2: the first convolution's forward)."""
    run, step = pytorch_run, 6  # resumed from step-000005: both environments start from A's state
    before = tree(run)
    recordings = {}
    for name, env in (("plain", None), ("again", None), ("sse41", {"ONEDNN_MAX_CPU_ISA": "SSE41"})):
        proc = replay_step(run, step, tmp_path / f"{name}.json", tmp_path, env)
        assert proc.returncode == 0, proc.stderr
        recordings[name] = read_ops(tmp_path / f"{name}.json")
    assert tree(run) == before  # a replay writes nothing into the run
    plain = recordings["plain"]
    assert plain["resumed_from"] == "step-000005" and plain["start_step"] == 5 and plain["step"] == step
    assert plain["loss_matches_run"] is True and plain["weights_match_run"] is True  # a boundary at step 6
    assert plain["recording_changed_nothing"] is True
    ops = [o["op"] for o in plain["ops"]]
    assert "aten.convolution.default" in ops and "aten.convolution_backward.default" in ops
    assert any(o["where"] == "backward, conv2 (ConvolutionBackward0)" for o in plain["ops"])
    assert any(o["where"].startswith("optimizer, fc1.weight") for o in plain["ops"])
    assert first_differing_operation(plain, recordings["again"]) is None
    assert recordings["sse41"]["recording_changed_nothing"] is True
    found = first_differing_operation(plain, recordings["sse41"])
    print(f"ONEDNN_MAX_CPU_ISA=SSE41: {found['text']}")
    assert found is not None and found["kind"] == "output" and found["inputs_equal"] is True
    assert found["op"].startswith("aten.") and found["random"] is False


def relabel(checkpoint: Path, framework: str) -> None:
    """Make a checkpoint's config name another framework, every hash recomputed (what a careful forger does)."""
    config = json.loads((checkpoint / "config.json").read_text())
    config["framework"]["name"] = framework
    blob = json.dumps(config).encode()
    (checkpoint / "config.json").write_bytes(blob)
    manifest = json.loads((checkpoint / "manifest.json").read_text())
    manifest["files"]["config.json"] = hashlib.sha256(blob).hexdigest()
    manifest["file_bytes"]["config.json"] = len(blob)
    manifest["config_hash"] = config_hash(config)
    manifest["manifest_sha256"] = manifest_self_digest(manifest)
    (checkpoint / "manifest.json").write_text(json.dumps(manifest))


@pytest.mark.process
@pytest.mark.parametrize("framework", ["mxnet"])
def test_other_frameworks_are_refused_in_one_line(pytorch_run, tmp_path, framework):
    """A run of a framework that is not ours: exit 2, one line, before anything is imported. The
    run is a PyTorch run's checkpoint relabelled (consistently: its hashes recomputed)."""
    shutil.copytree(pytorch_run, tmp_path / "a")
    for checkpoint in (tmp_path / "a" / "checkpoints").iterdir():
        relabel(checkpoint, framework)
    proc = replay_step(tmp_path / "a", 1, tmp_path / "ops.json", tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"reprocube: error: replay_step: the run's framework '{framework}' is not one of pytorch, tensorflow, jax"
    ]
    assert not (tmp_path / "ops.json").exists()


# --- end to end: JAX and TensorFlow, each step's inputs and kernels recorded ---------------------------
KERNEL_CASES = {
    # framework: (a setting that changes its CPU results, a kernel it must record, the op prefix)
    "jax": ({"XLA_FLAGS": "--xla_cpu_max_isa=AVX"}, ("jax.conv_general_dilated", "backward, conv1"), "jax."),
    "tensorflow": ({"ONEDNN_MAX_CPU_ISA": "SSE41"}, ("tf.Conv2DBackpropFilter", "backward, conv2"), "tf."),
}


@pytest.fixture(scope="module", params=sorted(KERNEL_CASES))
def kernels_run(request, generated, tmp_path_factory) -> tuple[str, Path]:
    framework = request.param
    return framework, train_run(framework, generated, tmp_path_factory.mktemp(f"{framework}-runs"))


@pytest.mark.process
def test_kernel_replays_record_the_steps_inputs_and_kernels_faithfully(kernels_run, tmp_path):
    """The recorded step (traced again to also return its kernels' values) gives the run's loss and
    weights and the unrecorded step's state; two replays agree entry for entry; a setting that changes
    the CPU's results is faithful too and, where it changes anything, named (which entry is not asserted:
    it depends on the machine's ISA; here, AVX-512: JAX backward fc2's matrix product gets another
    gradient, TensorFlow's first convolution computes differently)."""
    framework, run = kernels_run
    perturbation, kernel, prefix = KERNEL_CASES[framework]
    before = tree(run)
    recordings = {}
    for name, env in (("plain", None), ("again", None), ("perturbed", perturbation)):
        proc = replay_step(run, 6, tmp_path / f"{name}.json", tmp_path, env)
        assert proc.returncode == 0, proc.stderr
        recordings[name] = read_ops(tmp_path / f"{name}.json")
    assert tree(run) == before
    plain = recordings["plain"]
    assert plain["loss_matches_run"] is True and plain["weights_match_run"] is True
    assert all(r["recording_changed_nothing"] is True for r in recordings.values())
    wheres = [(o["op"], o["where"]) for o in plain["ops"]]
    assert any(op == "reprocube.step_input" and where.endswith("conv1.kernel") for op, where in wheres), wheres
    assert kernel in wheres and sum(op.startswith(prefix) for op, _ in wheres) >= 8, wheres
    assert first_differing_operation(plain, recordings["again"]) is None
    found = first_differing_operation(plain, recordings["perturbed"])
    print(f"{framework} {perturbation}: {found and found['text']}")
    if found is not None:
        assert found["op"].startswith((prefix, "reprocube.")) and found["kind"] in ("inputs", "output")
