"""The trace's per-step weight fingerprint (reprocube.formats.trace.fingerprint): exact and independent of the order
of the additions, computed by each trainer on its device in the step and equal to the NumPy reference (so
equal across frameworks for equal weights), stored compactly and read strictly, compared step by step, and
the same for a run stopped by SIGTERM mid-epoch and resumed as for the uninterrupted run."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from reprocube.errors import CheckpointError
from reprocube.formats.trace import (
    TENSOR_FINGERPRINT_STEPS,
    StepTrace,
    compare_traces,
    fingerprint,
    first_weight_difference,
    model_fingerprint,
)
from reprocube.training.backend import FRAMEWORKS
from reprocube.training.checkpoint import read_checkpoint
from reprocube.training.receipt import read_receipt

from helpers import reprocube

SMALL = ["epochs=2", "log.every_steps=5", "trace.every_steps=5"]
STEPS_PER_EPOCH = 21  # the generated dataset: 650 examples, batch 32


def python_mix(x: int) -> int:
    """x XOR (x * x mod 2**32), with Python's unbounded integers."""
    return x ^ ((x * x) % 2**32)


def python_int_fingerprint(array: np.ndarray) -> int:
    """The definition, with Python's unbounded integers: the sum of the mixed bit patterns, then modulo 2**32."""
    return sum(python_mix(int(x)) for x in np.asarray(array, np.float32).reshape(-1).view(np.uint32)) % 2**32


def random_bits(rng, shape, max_exponent: int = 254, min_exponent: int = 0) -> np.ndarray:
    """float32 of every sign, with biased exponents min_exponent (0: zeros, subnormals) to max_exponent,
    and no -0.0."""
    bits = rng.integers(0, 2**32, size=shape, dtype=np.uint64).astype(np.uint32)
    exponent = rng.integers(min_exponent, max_exponent + 1, size=shape, dtype=np.uint32)
    bits = (bits & np.uint32(0x807FFFFF)) | (exponent << np.uint32(23))
    bits[bits == 0x80000000] = 0
    return bits.view(np.float32)


def test_the_reference_is_the_wrapping_sum_of_the_bit_patterns_in_any_order():
    rng = np.random.default_rng(0)
    weights = {f"t{i}": random_bits(rng, (int(n),)) for i, n in enumerate(rng.integers(1, 40_000, size=6))}
    weights["nan_inf"] = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, 1.0], np.float32)
    expected = np.array([python_int_fingerprint(weights[n]) for n in sorted(weights)], np.uint32)
    assert fingerprint(weights).tolist() == expected.tolist()
    # Order of addition and layout do not matter: a transposed, reversed or shuffled tensor has the same one.
    shuffled = {n: rng.permutation(w.reshape(-1)) for n, w in weights.items()}
    assert fingerprint(shuffled).tolist() == expected.tolist()
    square = random_bits(rng, (50, 320))
    assert fingerprint({"w": square}) == fingerprint({"w": np.ascontiguousarray(square.T)})
    # One bit anywhere changes it.
    flipped = {n: w.copy() for n, w in weights.items()}
    flipped["t3"].view(np.uint32)[7] ^= 1
    assert (fingerprint(flipped) != expected).tolist() == [n == "t3" for n in sorted(weights)]
    assert model_fingerprint(expected[None]) == np.uint32(int(expected.astype(np.uint64).sum()) % 2**32)


def test_opposite_last_bit_changes_do_not_cancel():
    """What another CPU's kernels give (one element a unit up, another a unit down in its last bit) left
    a plain sum of the bit patterns unchanged; the mixed sum changes."""
    rng = np.random.default_rng(3)
    for _ in range(200):
        weights = random_bits(rng, (500,), max_exponent=130, min_exponent=120)
        moved = weights.copy()
        i, j = rng.choice(500, size=2, replace=False)
        moved.view(np.uint32)[i] += 1
        moved.view(np.uint32)[j] -= 1
        assert moved.view(np.uint32).sum(dtype=np.uint32) == weights.view(np.uint32).sum(dtype=np.uint32)
        assert fingerprint({"w": moved}) != fingerprint({"w": weights})


def torch_layout_weights(seed: int) -> dict[str, np.ndarray]:
    """Weights of the benchmark's CNN in PyTorch's names and layouts, normal (XLA's CPU kernels flush
    subnormals to zero) and of moderate size, so that a step with lr 0 leaves them exactly as they are, with
    sums of bit patterns that wrap many times."""
    rng = np.random.default_rng(seed)
    shapes = {"conv1": (10, 1, 5, 5), "conv2": (20, 10, 5, 5), "fc1": (50, 320), "fc2": (10, 50)}
    weights = {}
    for layer, shape in shapes.items():
        weights[f"{layer}.weight"] = random_bits(rng, shape, max_exponent=126, min_exponent=1)  # |w| < 1
        weights[f"{layer}.bias"] = random_bits(rng, (shape[0],), max_exponent=126, min_exponent=1)
    return weights


DEVICE_PROBE = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    from reprocube.training.backend import create_backend
    from reprocube.config import load_config
    from reprocube.data.sampler import EpochSampler
    from reprocube.data.store import load_dataset
    from reprocube.training.state import FrameworkState
    from test_trace_fingerprint import in_layout, torch_layout_weights

    framework, overrides = sys.argv[1], sys.argv[2:]
    cfg = load_config([f"framework={framework}", "device=cpu", "optimizer.lr=0", "optimizer.momentum=0", *overrides])
    dataset = load_dataset(cfg)
    backend = create_backend(cfg, dataset)
    sampler = EpochSampler(cfg.seed, len(dataset.train), cfg.batch_size, False)
    backend.begin_epoch(sampler.epoch_order(0))
    state = backend.export_state()
    imported = in_layout(framework, torch_layout_weights(7))
    backend.import_state(FrameworkState(imported, state.optimizer, state.rng))
    groups = []
    for first, end in ((0, 1), (1, 4)):  # a group of one step, then one of three
        backend.train_steps(sampler.steps_bounds(first, end), first)
        groups.append(backend.group_fingerprints().tolist())
    after = {
        name: array.reshape(-1).view(np.uint32)[:3].tolist() for name, array in backend.export_state().weights.items()
    }
    print(json.dumps({"groups": groups, "after": after}))
    """
)


def in_layout(framework: str, weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """PyTorch's weights in another framework's names and layouts (kernels HWIO and (in, out))."""
    if framework == "pytorch":
        return weights
    converted = {}
    for name, array in weights.items():
        layer, kind = name.split(".")
        if kind == "weight":
            axes = (2, 3, 1, 0) if array.ndim == 4 else (1, 0)
            converted[f"{layer}.kernel"] = np.ascontiguousarray(array.transpose(axes))
        else:
            converted[name] = array
    return converted


@pytest.mark.process
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_each_trainer_computes_the_reference_on_its_device(framework, generated, tmp_path):
    """Equal weights (the same values in each framework's layout) give every framework the same
    fingerprints, the reference's, after every step of a group (a step with lr 0 keeps them)."""
    path = os.pathsep.join([str(Path(__file__).parent), *sys.path])  # this module, reprocube and the packages
    proc = subprocess.run(
        [sys.executable, "-c", DEVICE_PROBE, framework, *generated.overrides(), "data.train_limit=256"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": path},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    weights = torch_layout_weights(7)
    expected = fingerprint(in_layout(framework, weights)).tolist()
    assert expected == fingerprint(weights).tolist()  # the layouts do not change it: one value for all three
    assert result["groups"] == [[expected], [expected] * 3]
    imported = in_layout(framework, weights)
    assert result["after"] == {n: a.reshape(-1).view(np.uint32)[:3].tolist() for n, a in imported.items()}


def trace_with(rng, steps: int, names: list[str], fingerprints: np.ndarray | None = None) -> StepTrace:
    trace = StepTrace(every_steps=10, first_step=0, tensor_names=list(names))
    if fingerprints is None:
        fingerprints = rng.integers(0, 2**32, size=(steps, len(names)), dtype=np.uint64).astype(np.uint32)
    losses = rng.random(steps, dtype=np.float32)
    for lo in range(0, steps, 7):  # groups of 7: the trace does not depend on the grouping
        trace.add_losses(losses[lo : lo + 7], fingerprints[lo : lo + 7])
    return trace


NAMES = ["conv1.bias", "conv1.weight", "fc1.bias", "fc1.weight"]


def test_a_trace_stores_one_fingerprint_a_step_and_each_tensors_for_the_first_steps():
    rng = np.random.default_rng(1)
    trace = trace_with(rng, 150, NAMES)
    value = trace.to_json()
    assert value["fingerprint_first_step"] == 0 and value["tensor_fingerprint_steps"] == TENSOR_FINGERPRINT_STEPS
    assert len(value["fingerprint_u32_le_base64"]) == len(_b64(np.zeros(150, np.uint32)))  # 4 bytes a step
    back = StepTrace.from_json(json.loads(json.dumps(value)), "t", CheckpointError)
    assert back.fingerprints.tolist() == trace.fingerprints.tolist()
    assert back.tensor_fingerprints.shape == (TENSOR_FINGERPRINT_STEPS, len(NAMES))
    assert back.tensor_fingerprints.tolist() == trace.tensor_fingerprints.tolist()
    assert back.to_json() == value


def test_a_trace_without_fingerprints_is_read_and_compared_as_before():
    rng = np.random.default_rng(2)
    old = trace_with(rng, 30, NAMES).to_json()
    for key in [k for k in old if "fingerprint" in k]:
        del old[key]
    trace = StepTrace.from_json(old, "t", CheckpointError)
    assert trace.fingerprint_first_step is None and trace.fingerprints.size == 0
    assert "fingerprint_u32_le_base64" not in trace.to_json()
    assert first_weight_difference(trace, trace) is None
    divergence = compare_traces(trace, trace)
    assert divergence.fingerprinted_steps == 0 and divergence.weights_identical and not divergence.loss_only
    # Resumed by this reprocube: the fingerprints start at the resume.
    trace.add_losses(np.ones(3, np.float32), np.ones((3, len(NAMES)), np.uint32))
    assert trace.fingerprint_first_step == 30 and len(trace.fingerprints) == 3
    assert trace.tensor_fingerprints.shape == (3, len(NAMES))
    assert StepTrace.from_json(trace.to_json(), "t", CheckpointError).to_json() == trace.to_json()


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("fingerprint_u32_le_base64", "AAAA", "holds 3 bytes, not 4 for each of its 150 fingerprinted steps"),
        ("fingerprint_u32_le_base64", "!!!!", "fingerprint_u32_le_base64 is not base64"),
        ("fingerprint_u32_le_base64", 12, "fingerprint_u32_le_base64 must be a string"),
        ("tensor_fingerprint_u32_le_base64", "", "not 4 for each of its 256 values (64 steps x 4 tensors)"),
        ("fingerprint_first_step", 151, "fingerprint_first_step must be an integer from 0 to 150"),
        ("fingerprint_first_step", True, "fingerprint_first_step must be an integer"),
        ("tensor_fingerprint_steps", -1, "tensor_fingerprint_steps must be an integer from 0"),
        ("tensor_fingerprint_steps", None, "tensor_fingerprint_steps must be an integer"),
    ],
)
def test_a_damaged_fingerprint_is_one_line_naming_the_key(key, value, message):
    good = trace_with(np.random.default_rng(3), 150, NAMES).to_json()
    bad = {**copy.deepcopy(good), key: value}
    with pytest.raises(CheckpointError, match="^t") as caught:
        StepTrace.from_json(bad, "t", CheckpointError)
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_fingerprint_keys_come_together_and_the_tensor_rows_must_sum_to_the_steps():
    good = trace_with(np.random.default_rng(4), 80, NAMES).to_json()
    partial = {k: v for k, v in good.items() if k != "tensor_fingerprint_steps"}
    with pytest.raises(CheckpointError, match="tensor_fingerprint_steps missing"):
        StepTrace.from_json(partial, "t", CheckpointError)
    trace = StepTrace.from_json(good, "t", CheckpointError)
    rows = trace.tensor_fingerprints.copy()
    rows[5, 1] += 1
    forged = {**good, "tensor_fingerprint_u32_le_base64": _b64(rows)}
    with pytest.raises(CheckpointError, match="does not sum to the model fingerprints"):
        StepTrace.from_json(forged, "t", CheckpointError)


def _b64(array: np.ndarray) -> str:
    import base64

    return base64.b64encode(np.ascontiguousarray(array, "<u4").tobytes()).decode()


def test_the_first_weight_difference_names_the_step_and_the_tensors():
    rng = np.random.default_rng(5)
    base = rng.integers(0, 2**32, size=(150, len(NAMES)), dtype=np.uint64).astype(np.uint32)
    a = trace_with(np.random.default_rng(6), 150, NAMES, base)
    assert first_weight_difference(a, a) is None
    # Within the per-tensor steps: the step and the tensors.
    early = base.copy()
    early[40:, 1] += 1
    early[41:, 3] += 5
    b = trace_with(np.random.default_rng(6), 150, NAMES, early)
    assert first_weight_difference(a, b) == {"step": 41, "tensors": ["conv1.weight"]}
    divergence = compare_traces(a, b)
    assert divergence.first_weight_step == 41 and divergence.first_weight_tensors == ["conv1.weight"]
    assert divergence.step == 41 and divergence.first_loss_step is None  # the losses are equal
    assert not divergence.weights_identical and not divergence.loss_only
    # Two tensors whose changes cancel in the model's sum: the per-tensor rows still see it.
    cancel = base.copy()
    cancel[10, 0] += 3
    cancel[10, 2] -= 3
    c = trace_with(np.random.default_rng(6), 150, NAMES, cancel)
    assert first_weight_difference(a, c) == {"step": 11, "tensors": ["conv1.bias", "fc1.bias"]}
    # Beyond them: the step exactly, the tensors unknown (the boundaries' digests may name them).
    late = base.copy()
    late[120:, 2] += 1
    d = trace_with(np.random.default_rng(6), 150, NAMES, late)
    assert first_weight_difference(a, d) == {"step": 121, "tensors": None}


def test_initial_weights_are_compared_apart_from_the_steps():
    """The boundary at global step 0 (the initial weights): a difference there is named as such, the first
    differing step stays step 1, and a trace without it (older receipts) compares as before."""
    rng = np.random.default_rng(9)
    weights = {name: rng.standard_normal(4, dtype=np.float32) for name in NAMES}
    rows = rng.integers(0, 2**32, size=(20, len(NAMES)), dtype=np.uint64).astype(np.uint32)

    def run(initial: dict | None) -> StepTrace:
        trace = StepTrace(every_steps=10, first_step=0, tensor_names=list(NAMES))
        if initial is not None:
            trace.add_boundary(0, initial)
        trace.add_losses(np.ones(20, np.float32), rows)
        trace.add_boundary(20, weights)
        return StepTrace.from_json(json.loads(json.dumps(trace.to_json())), "t", CheckpointError)

    same = compare_traces(run(weights), run(weights))
    assert same.initial_tensors == [] and same.step is None and same.weights_identical
    assert same.compared_boundaries == 1  # the boundaries after updates (losses-only needs one of them)
    other = {**weights, "fc1.bias": weights["fc1.bias"] + 1}
    differs = compare_traces(run(weights), run(other))
    assert differs.initial_tensors == ["fc1.bias"] and differs.step == 1
    assert not differs.weights_identical and not differs.loss_only and differs.first_boundary is None
    assert differs.last_matching_boundary is None  # step 20 agrees, but after the difference
    # The same tensors named in another order compare by name: a permutation hides nothing.
    permuted = run(other)
    permuted.tensor_names = permuted.tensor_names[::-1]
    for boundary in permuted.boundaries:
        boundary.tensors = boundary.tensors[::-1]
    assert compare_traces(run(weights), permuted).initial_tensors == ["fc1.bias"]
    unknown = compare_traces(run(None), run(other))
    assert unknown.initial_tensors is None and unknown.step is None and unknown.weights_identical


def test_losses_that_differ_while_every_fingerprint_agrees_are_loss_only():
    base = np.random.default_rng(7).integers(0, 2**32, size=(60, len(NAMES)), dtype=np.uint64).astype(np.uint32)
    a = trace_with(np.random.default_rng(8), 60, NAMES, base)
    b = trace_with(np.random.default_rng(8), 60, NAMES, base)
    b.losses.view(np.uint32)[20] ^= 1
    divergence = compare_traces(a, b)
    assert divergence.first_loss_step == 21 and divergence.step == 21
    assert divergence.first_weight_step is None and divergence.weights_identical and divergence.loss_only
    assert divergence.fingerprinted_steps == 60


def test_a_receipt_with_fingerprints_stays_under_32_kb_per_fashion_mnist_epoch():
    """The trace of 1 and of 4 epochs x 1875 steps (batch 32) with a training run's kind of losses, 8
    tensors, a boundary every 100 steps; a real receipt adds about 7.5 KB to it (config, environment,
    per-file source digests, epoch records; benchmarks/README.md)."""
    from test_trace_losses import training_like_losses

    rng = np.random.default_rng(0)
    weights = {f"layer{i}.weight": rng.standard_normal(10, dtype=np.float32) for i in range(8)}
    for epochs in (1, 4):
        losses = training_like_losses(epochs * 1875)
        trace = StepTrace(every_steps=100, first_step=0, tensor_names=sorted(weights))
        trace.add_boundary(0, weights)  # the initial weights
        for step in range(1, epochs * 1875 + 1):
            fingerprints = rng.integers(0, 2**32, size=(1, 8), dtype=np.uint64).astype(np.uint32)
            trace.add_losses(losses[step - 1 : step], fingerprints)
            if step % 100 == 0 or step % 1875 == 0:
                trace.add_boundary(step, weights)
        size = len(json.dumps(trace.to_json(), separators=(",", ":")))
        assert size < epochs * 32_768 - 8_000, (epochs, size)


@pytest.mark.process
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_an_interrupted_run_has_the_uninterrupted_fingerprints(framework, generated, tmp_path):
    """SIGTERM mid-epoch (after global step 32, not a trace boundary) and a resume in a fresh process: every
    step's fingerprint and the per-tensor rows are the uninterrupted run's, and the reference's at every
    checkpoint."""
    runs = {}
    for name, drill in (("a", None), ("c", 32)):
        common = [
            "train",
            f"framework={framework}",
            *generated.overrides(),
            *SMALL,
            f"output_dir={tmp_path}",
            f"run_name={name}",
        ]
        if drill is not None:
            assert reprocube(*common, f"preempt_at_step={drill}", cwd=tmp_path, check=False).returncode == 75
            common.append("resume=latest")
        reprocube(*common, cwd=tmp_path)
        runs[name] = read_receipt(tmp_path / name).trace
    a, c = runs["a"], runs["c"]
    assert a.fingerprint_first_step == c.fingerprint_first_step == 0
    assert len(a.fingerprints) == a.last_step == 2 * STEPS_PER_EPOCH
    assert a.fingerprints.tolist() == c.fingerprints.tolist()
    assert a.tensor_fingerprints.shape == (2 * STEPS_PER_EPOCH, 8)  # all 42 steps are within the first 64
    assert a.tensor_fingerprints.tolist() == c.tensor_fingerprints.tolist()
    divergence = compare_traces(a, c)
    assert divergence.step is None and divergence.weights_identical and divergence.fingerprinted_steps == 42
    # The device's fingerprint at each checkpoint (the SIGTERM's at step 32, the epochs') is the reference's
    # of the checkpoint's weights; and each checkpoint's own trace holds the fingerprints up to it.
    checkpoints = sorted((tmp_path / "c" / "checkpoints").iterdir())
    assert [p.name for p in checkpoints] == ["epoch-0001", "epoch-0002", "step-000032"]
    for path in checkpoints:
        checkpoint = read_checkpoint(path)
        step = checkpoint.manifest.global_step
        assert fingerprint(checkpoint.content.weights).tolist() == a.tensor_fingerprints[step - 1].tolist(), path
        saved = StepTrace.from_json(checkpoint.content.state["trace"], str(path), CheckpointError)
        assert saved.fingerprints.tolist() == a.fingerprints[:step].tolist()
