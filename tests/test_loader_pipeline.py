"""data.pipeline=loader: each framework's own loader with worker processes and random augmentation, under the
same bit-exact guarantee: one digest whatever the worker count, exact restart, resume from every epoch and
from a SIGTERM mid-epoch (with the same or another worker count), and the stateful negative control
caught by verify."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from reprocube.data import augment
from reprocube.data.pipeline import ExampleSource
from reprocube.data.store import Split
from reprocube.training.backend import FRAMEWORKS

from helpers import epoch_digests, reprocube

LOADER = ["data.pipeline=loader", "data.augment=true", "epochs=2", "log.every_steps=5"]
STEPS_PER_EPOCH = 21


def train(generated, cwd: Path, framework: str, name: str, *extra: str, check: bool = True):
    return reprocube(
        "train",
        f"framework={framework}",
        *generated.overrides(),
        *LOADER,
        f"run_name={name}",
        *extra,
        cwd=cwd,
        check=check,
    )


@pytest.mark.process
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_one_digest_for_every_worker_count_and_resume_point(framework, generated, tmp_path):
    for workers in (0, 1, 2):
        train(generated, tmp_path, framework, f"w{workers}", f"data.workers={workers}")
    digests = [epoch_digests(tmp_path / "runs" / f"w{workers}") for workers in (0, 1, 2)]
    assert digests[0] == digests[1] == digests[2] and len(digests[0]) == 2
    # Stopped mid-epoch 2 by a real SIGTERM with 2 workers: resumed with 2 (the loader's own state) and with
    # 1 (the position alone), both end bit-identical.
    for resumed_with in (2, 1):
        name = f"sigterm-{resumed_with}"
        stopped = train(generated, tmp_path, framework, name, "data.workers=2", "preempt_at_step=30", check=False)
        assert stopped.returncode == 75, stopped.stderr
        state = json.loads((tmp_path / "runs" / name / "checkpoints" / "step-000030" / "state.json").read_text())
        assert state["loader"]["epoch"] == 1 and state["loader"]["step_in_epoch"] == 30 - STEPS_PER_EPOCH
        train(generated, tmp_path, framework, name, f"data.workers={resumed_with}", "resume=latest")
        assert epoch_digests(tmp_path / "runs" / name) == digests[0], resumed_with
    # Resumed in a fresh process from the epoch-1 checkpoint (with 1 worker): the same epoch 2.
    train(
        generated,
        tmp_path,
        framework,
        "from-epoch-1",
        "data.workers=1",
        f"resume={tmp_path / 'runs' / 'w2' / 'checkpoints' / 'epoch-0001'}",
    )
    assert epoch_digests(tmp_path / "runs" / "from-epoch-1") == {"epoch-0002": digests[0]["epoch-0002"]}
    # Without augmentation the loader feeds the resident path's very batches: the same weights (checked for
    # PyTorch here; for all three on Fashion-MNIST by hand, see the note: it costs CI a minute).
    if framework != "pytorch":
        return
    train(generated, tmp_path, framework, "plain", "data.augment=false")
    reprocube("train", f"framework={framework}", *generated.overrides(), "epochs=2", "run_name=resident", cwd=tmp_path)
    assert epoch_digests(tmp_path / "runs" / "plain") == epoch_digests(tmp_path / "runs" / "resident")
    assert epoch_digests(tmp_path / "runs" / "plain") != digests[0]  # the augmentation changed the inputs


@pytest.mark.process
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_verify_catches_the_stateful_control_and_says_why(framework, generated, tmp_path):
    common = ["verify", f"framework={framework}", *generated.overrides(), *LOADER, "data.workers=2"]
    failed = reprocube(*common, "data.augment_rng=stateful", cwd=tmp_path, check=False, timeout=900)
    assert failed.returncode == 6, failed.stdout + failed.stderr
    assert "NOT reproducible" in failed.stdout and "known not to resume exactly" in failed.stdout
    reference = tmp_path / "runs" / f"verify-{framework}" / "reference"
    assert "data.augment_rng=stateful is known not to resume exactly" in (reference / "verify.md").read_text()
    result = json.loads((reference / "verify.json").read_text())
    # A link (from scratch, or from the reference's checkpoint) differs: the workers' generators are new.
    assert not all(c["passed"] for c in result["checks"] if c["name"].startswith("link-"))


@pytest.mark.process
def test_verify_passes_the_stateless_loader_with_a_sigterm_mid_epoch(generated, tmp_path):
    proc = reprocube(
        "verify",
        "framework=pytorch",
        *generated.overrides(),
        *LOADER,
        "data.workers=2",
        "verify.mid_epoch=true",
        cwd=tmp_path,
        timeout=900,
    )
    assert "verdict: all bit-identical" in proc.stdout and "known not to resume" not in proc.stdout


def small_split(n: int = 6) -> Split:
    rng = np.random.default_rng(0)
    return Split(rng.standard_normal((n, 1, 28, 28), dtype=np.float32), np.arange(n, dtype=np.int64))


def test_the_augmentation_changes_the_inputs_as_a_pure_function_of_seed_epoch_and_index():
    source = ExampleSource(small_split(), seed=7, augment=True, stateful_rng=False, background=-0.5)
    plain = ExampleSource(small_split(), seed=7, augment=False, stateful_rng=False, background=-0.5)
    indices = np.arange(6)
    images, labels = source.examples(3, indices)
    original, _ = plain.examples(3, indices)
    assert (labels == np.arange(6)).all() and images.dtype == np.float32 and images.shape == original.shape
    assert not np.array_equal(images, original)  # some examples were flipped or shifted
    # The same example gives the same bytes however it is batched (a worker, a prefetch, a resume)...
    alone = np.concatenate([source.examples(3, [i])[0] for i in indices])
    assert alone.tobytes() == images.tobytes()
    assert source.examples(3, indices[::-1])[0].tobytes() == images[::-1].tobytes()
    # ...and other bytes in another epoch or with another seed.
    assert source.examples(4, indices)[0].tobytes() != images.tobytes()
    other_seed = ExampleSource(small_split(), seed=8, augment=True, stateful_rng=False, background=-0.5)
    assert other_seed.examples(3, indices)[0].tobytes() != images.tobytes()


def test_flip_and_shift_move_pixels_exactly():
    image = np.zeros((1, 1, 28, 28), np.float32)
    image[0, 0, 5, 7] = 1.0
    shifted = augment.apply(image, np.array([[0, 2, -1]]), background=-3.0)
    assert shifted[0, 0, 7, 6] == 1.0 and (shifted == 1.0).sum() == 1
    assert (shifted[0, 0, :2, :] == -3.0).all() and (shifted[0, 0, :, -1] == -3.0).all()  # uncovered: background
    flipped = augment.apply(image, np.array([[1, 0, 0]]), background=-3.0)
    assert flipped[0, 0, 5, 27 - 7] == 1.0 and (flipped == 1.0).sum() == 1


def test_the_parameters_cover_every_flip_and_shift_evenly():
    params = augment.stateless_params(0, 0, np.arange(50_000))
    assert set(params[:, 0]) == {0, 1} and abs(params[:, 0].mean() - 0.5) < 0.01
    for column in (1, 2):
        counts = np.bincount(params[:, column] + augment.MAX_SHIFT)
        assert len(counts) == 2 * augment.MAX_SHIFT + 1 and counts.min() > 0.18 * len(params)


@pytest.mark.process
@pytest.mark.parametrize(
    "override, message",
    [
        ("data.augment=true", "need data.pipeline=loader"),
        ("data.workers=2", "need data.pipeline=loader"),
        ("data.pipeline=stream", "data.pipeline must be resident or loader"),
        ("data.augment_rng=global", "data.augment_rng must be stateless or stateful"),
        ("data.workers=-1", "data.workers must be an integer"),
    ],
)
def test_bad_loader_settings_are_refused(override, message, generated, tmp_path):
    proc = reprocube("train", *generated.overrides(), override, cwd=tmp_path, check=False)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
