"""Every trainer, end to end in fresh processes: restart equality, resume from every checkpoint,
preemption by signal, and refusal of tampered or mismatched checkpoints. Bit-exactness is compared as
weights digests (sha256 of the parameter bytes) and exactly equal metrics: no tolerance anywhere.
Each test runs once per framework (the module-scoped `framework` fixture)."""

from __future__ import annotations

import hashlib
import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from reprocube.training.backend import BACKENDS as BACKEND_CLASS
from reprocube.training.metrics import DETERMINISTIC_EPOCH_FIELDS

from helpers import (
    GeneratedDataset,
    epoch_digests,
    error_lines,
    make_payloads,
    manifest,
    read_metrics,
    reprocube,
    wait_for_global_step,
)

pytestmark = pytest.mark.process  # every test here starts a process: not in make test-quick

EPOCHS = 3
# What env.json must say about determinism and threads (threads=2 by default).
EXPECTED_INFO = {
    "pytorch": {"deterministic_algorithms": True, "num_threads": 2},
    "tensorflow": {
        "op_determinism": True,
        "intra_op_threads": 1,  # threads=2 over framework.towers=2
        "inter_op_threads": 2,
        "jit_compile": False,
        "onednn": True,
    },
    "jax": {
        "backend": "cpu",
        "prng_impl": "threefry2x32",
        "cpu_affinity": 2,
        "xla_flags": "--xla_gpu_deterministic_ops=true",
    },
}
VERSION_KEY = {"pytorch": "torch", "tensorflow": "tensorflow", "jax": "jax"}


@pytest.fixture(scope="module", params=sorted(BACKEND_CLASS))
def framework(request):
    return request.param


def deterministic_metrics(run_dir):
    records = read_metrics(run_dir / "metrics.jsonl")
    epochs = [
        {k: r[k] for k in (*DETERMINISTIC_EPOCH_FIELDS, "weights_digest")} for r in records if r["kind"] == "epoch"
    ]
    steps = [r for r in records if r["kind"] == "step"]
    return epochs, steps


@pytest.fixture(scope="module")
def workdir(tmp_path_factory, framework):
    return tmp_path_factory.mktemp(f"runs-{framework}")


@pytest.fixture(scope="module")
def train(generated, workdir, framework):
    def run(*overrides, check=True):
        return reprocube(
            "train",
            f"framework={framework}",
            *generated.overrides(),
            f"epochs={EPOCHS}",
            "log.every_steps=5",
            *overrides,
            cwd=workdir,
            check=check,
        )

    return run


@pytest.fixture(scope="module")
def reference(train, workdir):
    train("run_name=reference")
    return workdir / "runs" / "reference"


def test_run_directory_layout(reference, framework):
    assert {p.name for p in reference.iterdir()} == {
        ".reprocube-run",
        "config.yaml",
        "env.json",
        "sessions.jsonl",
        "metrics.jsonl",
        "receipt.json",
        "checkpoints",
    }
    assert sorted(p.name for p in (reference / "checkpoints").iterdir()) == ["epoch-0001", "epoch-0002", "epoch-0003"]
    receipt = json.loads((reference / "receipt.json").read_text())
    assert (
        receipt["complete"]
        and receipt["trace"]["steps"] == 63
        and receipt["checkpoints"] == ["epoch-0001", "epoch-0002", "epoch-0003"]
    )
    assert [r["weights_digest"] for r in receipt["epochs"]] == list(epoch_digests(reference).values())
    env = json.loads((reference / "env.json").read_text())
    assert {k: env["framework"][k] for k in EXPECTED_INFO[framework]} == EXPECTED_INFO[framework]
    final = manifest(reference / "checkpoints" / "epoch-0003")
    assert (final["framework"], final["epoch"], final["seed"], final["global_step"]) == (framework, 3, 0, 63)
    assert len(final["metrics"]["epochs"]) == 3
    assert final["weights_digest"] == deterministic_metrics(reference)[0][-1]["weights_digest"]


def test_restart_gives_identical_weights_at_every_epoch(reference, train, workdir):
    train("run_name=restart")
    restart = workdir / "runs" / "restart"
    assert epoch_digests(restart) == epoch_digests(reference)
    assert len(set(epoch_digests(reference).values())) == EPOCHS  # the weights did change each epoch
    assert deterministic_metrics(restart) == deterministic_metrics(reference)


def test_a_different_seed_gives_different_weights(reference, train, workdir):
    train("seed=1", "run_name=seed1")
    other = epoch_digests(workdir / "runs" / "seed1")
    for name, digest in epoch_digests(reference).items():
        assert other[name] != digest


@pytest.mark.parametrize("k", range(1, EPOCHS))
def test_resume_from_each_epoch_checkpoint_is_bit_exact(reference, train, workdir, framework, k):
    train(f"resume={reference}/checkpoints/epoch-{k:04d}", f"run_name=resumed-from-{k}")
    resumed = workdir / "runs" / f"resumed-from-{k}"
    assert epoch_digests(resumed) == {n: d for n, d in epoch_digests(reference).items() if int(n[-4:]) > k}
    assert deterministic_metrics(resumed) == deterministic_metrics(reference)  # history carried over, then equal
    assert json.loads((resumed / "env.json").read_text())["framework"]["name"] == framework
    [session] = map(json.loads, (resumed / "sessions.jsonl").read_text().splitlines())
    assert session["resumed_from"] == f"{reference}/checkpoints/epoch-{k:04d}"
    assert session["position"] == {"epoch": k, "step_in_epoch": 0, "global_step": 21 * k}


def test_a_checkpoint_written_before_the_state_version_resumes_bit_exactly(
    copy_of_reference, train, tmp_path, framework
):
    """state.json version 1 (before issue 14: no "version", and a "framework" mapping of scalars) is still
    read: rewrite a checkpoint into that layout, re-sign it, resume from it."""
    from reprocube.training.checkpoint import manifest_self_digest
    from reprocube.training.state import STATE_VERSION

    checkpoint = copy_of_reference / "checkpoints" / "epoch-0001"
    state = json.loads((checkpoint / "state.json").read_text())
    assert state.pop("version") == STATE_VERSION
    for later in ("trace", "loader", "sessions"):  # keys that came after version 1
        state.pop(later)
    state["framework"] = {"pytorch": {"cuda_generators": 0}, "tensorflow": {}, "jax": {"prng_impl": "threefry2x32"}}[
        framework
    ]
    blob = json.dumps(state, sort_keys=True, indent=1).encode()
    (checkpoint / "state.json").write_bytes(blob)
    edited = manifest(checkpoint)
    edited["files"]["state.json"] = hashlib.sha256(blob).hexdigest()
    edited["file_bytes"]["state.json"] = len(blob)
    edited["manifest_sha256"] = manifest_self_digest(edited)
    (checkpoint / "manifest.json").write_text(json.dumps(edited))
    train(f"resume={checkpoint}", "run_name=from-version-1", f"output_dir={tmp_path / 'runs'}")
    assert epoch_digests(tmp_path / "runs" / "from-version-1") == {
        n: d for n, d in epoch_digests(copy_of_reference).items() if n != "epoch-0001"
    }


def test_extending_a_run_with_more_epochs_is_bit_exact(reference, train, workdir):
    reprocube_short = train("epochs=2", "run_name=extended")
    assert "done" in reprocube_short.stdout
    train("resume=latest", "run_name=extended")  # epochs=3 from the fixture
    assert epoch_digests(workdir / "runs" / "extended") == epoch_digests(reference)


def test_mid_epoch_checkpoints_do_not_change_the_result(reference, train, workdir):
    train("checkpoint.every_steps=7", "run_name=every7")
    every7 = workdir / "runs" / "every7"
    steps = sorted(p.name for p in (every7 / "checkpoints").glob("step-*"))
    assert steps == [f"step-{s:06d}" for s in range(7, 63, 7) if s % 21]  # none where an epoch checkpoint follows
    assert epoch_digests(every7) == epoch_digests(reference)
    assert deterministic_metrics(every7) == deterministic_metrics(reference)
    # resume from a mid-epoch checkpoint (epoch 2, step 7 of 21) in a fresh process, with another cadence
    train(f"resume={every7}/checkpoints/step-000028", "run_name=from-step28")
    from_step28 = workdir / "runs" / "from-step28"
    assert epoch_digests(from_step28) == {n: d for n, d in epoch_digests(reference).items() if n != "epoch-0001"}
    assert deterministic_metrics(from_step28) == deterministic_metrics(reference)


def test_sparse_epoch_checkpoints_with_mid_epoch_ones_at_the_epoch_end(reference, train, workdir):
    train("checkpoint.every_epochs=2", "checkpoint.every_steps=21", "run_name=sparse")
    sparse = workdir / "runs" / "sparse"
    assert sorted(p.name for p in (sparse / "checkpoints").iterdir()) == ["epoch-0002", "epoch-0003", "step-000021"]
    assert epoch_digests(sparse) == {n: d for n, d in epoch_digests(reference).items() if n != "epoch-0001"}
    # epoch 1's weights are still recorded in the metrics, and equal
    assert deterministic_metrics(sparse) == deterministic_metrics(reference)


@pytest.fixture(scope="module")
def larger(tmp_path_factory):
    """Enough steps (200 per epoch) for a signal to land mid-epoch."""
    dataset = GeneratedDataset(tmp_path_factory.mktemp("larger"), make_payloads(train=6400, test=200, seed=5))
    dataset.write_raw()
    return dataset


LARGER_ARGS = ["epochs=2", "log.every_steps=1"]


_LARGER_REFERENCES: dict[str, Path] = {}


def larger_reference(framework: str, larger, tmp_path_factory) -> Path:
    """The uninterrupted run on the larger dataset, trained once per framework for the tests below."""
    if framework not in _LARGER_REFERENCES:
        cwd = tmp_path_factory.mktemp(f"larger-runs-{framework}")
        reprocube(
            "train", f"framework={framework}", *larger.overrides(), *LARGER_ARGS, "run_name=uninterrupted", cwd=cwd
        )
        _LARGER_REFERENCES[framework] = cwd / "runs" / "uninterrupted"
    return _LARGER_REFERENCES[framework]


def test_sigterm_mid_epoch_then_resume_latest_is_bit_exact(larger, tmp_path_factory, tmp_path, framework):
    reference = larger_reference(framework, larger, tmp_path_factory)
    signal_mid_epoch_then_resume_latest(framework, larger, reference, tmp_path, signal.SIGTERM)


@pytest.mark.parametrize("signum", [signal.SIGUSR1, signal.SIGINT])
def test_other_signals_mid_epoch_then_resume_latest_are_bit_exact(larger, tmp_path_factory, tmp_path, signum):
    """The shared loop handles the three signals alike whatever the trainer: the other two on PyTorch (each
    costs CI two processes per framework; SIGTERM runs on all three above)."""
    reference = larger_reference("pytorch", larger, tmp_path_factory)
    signal_mid_epoch_then_resume_latest("pytorch", larger, reference, tmp_path, signum)


def signal_mid_epoch_then_resume_latest(framework, larger, reference, tmp_path, signum):
    args = [f"framework={framework}", *larger.overrides(), *LARGER_ARGS]

    run_dir = tmp_path / "runs" / "preempted"
    proc = subprocess.Popen(
        [sys.executable, "-m", "reprocube", "train", *args, "run_name=preempted"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_for_global_step(run_dir / "metrics.jsonl", 250, proc)  # inside epoch 2 (steps 201-400)
    proc.send_signal(signum)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 75, stderr
    assert f"stopped by {signal.Signals(signum).name}" in stdout
    [checkpoint] = (run_dir / "checkpoints").glob("step-*")
    stopped = manifest(checkpoint)
    assert (
        stopped["epoch"] == 1
        and 0 < stopped["step_in_epoch"] < 200
        and stopped["reason"] == signal.Signals(signum).name
    )

    resumed = reprocube("train", *args, "run_name=preempted", "resume=latest", cwd=tmp_path)
    assert f"resumed from {checkpoint.relative_to(tmp_path)} at epoch 1" in resumed.stdout
    assert epoch_digests(run_dir) == epoch_digests(reference)
    assert deterministic_metrics(run_dir) == deterministic_metrics(reference)


# reprocube's program with training's signal handlers installed 1 s late, after "set-up" is printed: a window in
# which only what the program's start holds can keep SLURM's warning (in a SIF, a slow start under load).
LATE_HANDLERS = """
import sys, time
from reprocube.training import preemption
enter = preemption.StopRequest.__enter__
def late(self):
    print("set-up", flush=True)
    time.sleep(1)
    return enter(self)
preemption.StopRequest.__enter__ = late
from reprocube.__main__ import run
sys.argv[0] = "reprocube"
run()
"""


def test_slurms_warning_during_start_up_is_held_and_ends_in_a_checkpoint(larger, tmp_path):
    """SLURM's warning (USR1) before training handles signals: it neither kills the process, as USR1 does by
    default (a job in a SIF died so, 138: Apptainer does not pass preemptible.sh's ignore on), nor is lost:
    the run stops after its first step with a checkpoint, exit 75."""
    run_dir = tmp_path / "runs" / "warned"
    args = ["train", "framework=pytorch", *larger.overrides(), *LARGER_ARGS, "run_name=warned"]
    proc = subprocess.Popen(
        [sys.executable, "-c", LATE_HANDLERS, *args],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout.readline() == "set-up\n", proc.communicate()
    proc.send_signal(signal.SIGUSR1)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 75, (proc.returncode, stderr)
    assert "stopped by SIGUSR1" in stdout
    [checkpoint] = (run_dir / "checkpoints").glob("step-*")
    assert manifest(checkpoint)["reason"] == "SIGUSR1" and manifest(checkpoint)["global_step"] == 1


# --- refusals ---------------------------------------------------------------------------------


@pytest.fixture
def copy_of_reference(reference, tmp_path):
    target = tmp_path / "runs" / "copy"
    shutil.copytree(reference, target)
    return target


def test_a_checkpoint_with_a_changed_byte_is_refused(copy_of_reference, train, tmp_path):
    weights = copy_of_reference / "checkpoints" / "epoch-0002" / "weights.safetensors"
    data = bytearray(weights.read_bytes())
    data[-3] ^= 0x10
    weights.write_bytes(bytes(data))
    proc = train(f"resume={weights.parent}", "run_name=tampered", f"output_dir={tmp_path / 'runs'}", check=False)
    assert proc.returncode == 4
    assert error_lines(proc) == [
        f"reprocube: error: checkpoint {weights.parent}: "
        "weights.safetensors does not match its sha256 in the manifest (corrupted or modified)"
    ]
    assert not (tmp_path / "runs" / "tampered").exists()


def test_a_checkpoint_with_a_missing_file_is_refused(copy_of_reference, train, tmp_path):
    (copy_of_reference / "checkpoints" / "epoch-0003" / "rng.safetensors").unlink()
    proc = train(
        f"resume={copy_of_reference}/checkpoints/epoch-0003",
        "run_name=other",
        f"output_dir={tmp_path / 'runs'}",
        check=False,
    )
    assert proc.returncode == 4
    assert "is incomplete: missing rng.safetensors" in proc.stderr


def test_resume_latest_sets_a_damaged_newest_checkpoint_aside(copy_of_reference, reference, train, tmp_path):
    (copy_of_reference / "checkpoints" / "epoch-0003" / "rng.safetensors").unlink()
    proc = train("resume=latest", "run_name=copy", f"output_dir={tmp_path / 'runs'}")
    [warning] = error_lines(proc)
    assert warning.startswith("reprocube: warning:") and "is incomplete: missing rng.safetensors" in warning
    assert (copy_of_reference / "checkpoints" / ".unreadable-epoch-0003" / "weights.safetensors").exists()  # kept
    assert epoch_digests(copy_of_reference) == epoch_digests(reference)  # epoch 3 trained again, bit-identical


def test_a_checkpoint_from_a_different_config_is_refused(reference, train, tmp_path):
    proc = train(
        f"resume={reference}/checkpoints/epoch-0001", "optimizer.lr=0.02", "threads=1", "run_name=other", check=False
    )
    assert proc.returncode == 4
    assert "was made with a different config: optimizer.lr: 0.01 -> 0.02; threads: 2 -> 1" in proc.stderr


def test_a_fresh_run_never_overwrites_an_earlier_one(reference, train):
    before = epoch_digests(reference)
    proc = train("run_name=reference", check=False)
    assert proc.returncode == 2
    assert "already holds checkpoints; pass resume=latest" in proc.stderr
    assert epoch_digests(reference) == before


def test_resuming_an_earlier_checkpoint_into_its_own_run_is_refused(copy_of_reference, train, tmp_path):
    proc = train(
        f"resume={copy_of_reference}/checkpoints/epoch-0001",
        "run_name=copy",
        f"output_dir={tmp_path / 'runs'}",
        check=False,
    )
    assert proc.returncode == 2
    assert "would overwrite later checkpoints" in proc.stderr


def test_an_unwritable_output_dir_ends_in_one_line(train, tmp_path, framework):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    proc = train(f"output_dir={blocker}/runs", check=False)
    assert proc.returncode == 1
    assert error_lines(proc) == [f"reprocube: error: Not a directory: {blocker}/runs/{framework}-seed0"]


# --- hooks in a fresh process: on the Nth call of a function, send SIGTERM to itself, or skip it ----

HOOKED_RUN = """
import importlib, os, signal, sys
action, target, when, argv = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4:]
module_name, path = target.split(":")
owner = importlib.import_module(module_name)
*parents, name = path.split(".")
for parent in parents:
    owner = getattr(owner, parent)
original, calls = getattr(owner, name), [0]
def hooked(*args, **kwargs):
    calls[0] += 1
    if calls[0] == when or (action != "signal" and when == 0):
        if action == "skip":
            return None
        if action == "first-arg":
            return args[0]
        os.kill(os.getpid(), signal.SIGTERM)  # delivered before the call proceeds
    return original(*args, **kwargs)
setattr(owner, name, hooked)
from reprocube.cli import main
sys.exit(main(argv))
"""


def _hooked_train(action, target, call, framework, generated, cwd, *overrides):
    args = [
        "train",
        f"framework={framework}",
        *generated.overrides(),
        f"epochs={EPOCHS}",
        "log.every_steps=5",
        *overrides,
    ]
    return subprocess.run(
        [sys.executable, "-c", HOOKED_RUN, action, target, str(call), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.parametrize(
    "method, call, stopped_at",
    [
        # the last step of epoch 1 (steps go in groups of 5: log.every_steps=5): the epoch ends first (its
        # evaluation and checkpoint), never a step checkpoint at the epoch's end, which no reader accepts
        (".train_steps", 5, "epoch-0001"),
        (".evaluate", 1, "epoch-0001"),  # during evaluation
        ("reprocube.training.loop:write_checkpoint", 1, "epoch-0002"),  # while writing the epoch-0002 checkpoint
    ],
)
def test_a_signal_at_any_point_ends_in_a_checkpoint_and_a_bit_exact_resume(
    reference, generated, workdir, framework, method, call, stopped_at
):
    name = f"hooked-{stopped_at}-{method.rsplit('.', 1)[-1].rsplit(':', 1)[-1]}"  # two cases stop at epoch-0001
    target = BACKEND_CLASS[framework] + method if method.startswith(".") else method
    # every_epochs=2: a signal during epoch 1's evaluation must still write epoch-0001
    proc = _hooked_train(
        "signal", target, call, framework, generated, workdir, f"run_name={name}", "checkpoint.every_epochs=2"
    )
    assert proc.returncode == 75, proc.stderr
    run_dir = workdir / "runs" / name
    latest = max(
        (run_dir / "checkpoints").iterdir(), key=lambda p: (manifest(p)["global_step"], p.name.startswith("epoch"))
    )
    assert latest.name == stopped_at
    reprocube(
        "train",
        f"framework={framework}",
        *generated.overrides(),
        f"epochs={EPOCHS}",
        "log.every_steps=5",
        f"run_name={name}",
        "resume=latest",
        cwd=workdir,
    )
    assert epoch_digests(run_dir)["epoch-0003"] == epoch_digests(reference)["epoch-0003"]
    assert deterministic_metrics(run_dir) == deterministic_metrics(reference)


def test_a_signal_during_the_last_evaluation_completes_the_run(reference, generated, workdir, framework):
    proc = _hooked_train(
        "signal", BACKEND_CLASS[framework] + ".evaluate", EPOCHS, framework, generated, workdir, "run_name=last-eval"
    )
    assert proc.returncode == 0, proc.stderr
    assert epoch_digests(workdir / "runs" / "last-eval") == epoch_digests(reference)


# The dropout randomness at the resume point is what makes resume exact: break it in the resumed run
# only and the run must differ (this is the test that could fail). For TensorFlow: skip restoring the
# Keras Dropout SeedGenerator states that no Keras save path stores; PyTorch: skip restoring the CPU
# generator that draws the masks; JAX: make the step key ignore the global step, as a trainer that
# restarts its step counter would.
BREAK_DROPOUT_RNG = {
    "pytorch": ("skip", "torch:set_rng_state"),
    "tensorflow": ("skip", BACKEND_CLASS["tensorflow"] + "._restore_seed_generators"),
    "jax": ("first-arg", "jax.random:fold_in"),
}


def test_without_the_dropout_rng_state_a_resumed_run_differs(reference, generated, workdir, framework):
    action, target = BREAK_DROPOUT_RNG[framework]
    proc = _hooked_train(
        action,
        target,
        0,
        framework,
        generated,
        workdir,
        f"resume={reference}/checkpoints/epoch-0001",
        "run_name=no-rng",
    )
    assert proc.returncode == 0, proc.stderr
    resumed, expected = epoch_digests(workdir / "runs" / "no-rng"), epoch_digests(reference)
    assert resumed["epoch-0002"] != expected["epoch-0002"] and resumed["epoch-0003"] != expected["epoch-0003"]


def test_divergence_ends_in_one_line_without_a_checkpoint(train, workdir):
    proc = train("epochs=1", "optimizer.lr=1e30", "run_name=diverged", check=False)
    assert proc.returncode == 5
    [line] = error_lines(proc)
    assert line.startswith("reprocube: error: training diverged in epoch 1 (train_loss nan")
    assert not (workdir / "runs" / "diverged" / "checkpoints").exists()


def test_a_run_directory_in_use_is_refused(reference, train):
    import fcntl
    import os

    fd = os.open(reference, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        proc = train("run_name=reference", "resume=latest", "epochs=4", check=False)
    finally:
        os.close(fd)
    assert proc.returncode == 2
    assert error_lines(proc) == [
        "reprocube: error: run directory runs/reference is in use by another reprocube process"
    ]


def test_resuming_in_another_environment_is_reported(copy_of_reference, train, tmp_path, framework):
    from reprocube.training.checkpoint import manifest_self_digest

    path = copy_of_reference / "checkpoints" / "epoch-0002" / "manifest.json"
    edited = json.loads(path.read_text())
    edited["framework_info"][VERSION_KEY[framework]] = (
        "2.99.0"  # as if written by another version, consistently re-hashed
    )
    edited["manifest_sha256"] = manifest_self_digest(edited)
    path.write_text(json.dumps(edited))
    proc = train(f"resume={path.parent}", "run_name=elsewhere", f"output_dir={tmp_path / 'runs'}")
    assert (
        "note: resuming in a different environment" in proc.stdout
        and f"{VERSION_KEY[framework]}: 2.99.0 -> " in proc.stdout
    )


def test_pytorch_sets_deterministic_kernels_without_loading_torch_compile():
    """The eager flag that deterministic=true sets (env.json's deterministic_algorithms) is set and cleared,
    and torch._inductor is never imported: torch.use_deterministic_algorithms imports it for torch.compile's
    own flag, 1.5-6 s of every PyTorch process here (frameworks/pytorch._use_deterministic_algorithms)."""
    script = (
        "import sys, torch\n"
        "from reprocube.frameworks.pytorch import _use_deterministic_algorithms as use\n"
        "use(True)\n"
        "on = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())\n"
        "use(False); off = torch.are_deterministic_algorithms_enabled()\n"
        "print(on, off, 'torch._inductor' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.split("\n")[0] == "(True, False) False False", done.stdout + done.stderr
