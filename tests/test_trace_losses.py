"""The trace's loss bits as stored (reprocube.formats.trace): version 2 deflates their byte planes, version 1 (the
plain bytes) is still read, and a damaged or hostile encoding is one line naming the key, never a loss
trace other than the one written and never an expansion to hundreds of MB."""

from __future__ import annotations

import base64
import json
import zlib

import numpy as np
import pytest

from reprocube.errors import CheckpointError
from reprocube.formats.trace import LOSS_KEYS, TRACE_VERSION, StepTrace, decode_losses, encode_losses

KEY = LOSS_KEYS[TRACE_VERSION]


def training_like_losses(steps: int, seed: int = 0) -> np.ndarray:
    """A loss curve as training gives one (falling from about 2.3, noisy): what the encoding is sized for."""
    rng = np.random.default_rng(seed)
    curve = 0.35 + 1.95 * np.exp(-np.arange(steps) / 400)
    return (curve * rng.uniform(0.7, 1.3, steps)).astype(np.float32)


def trace_of(losses: np.ndarray) -> StepTrace:
    trace = StepTrace(every_steps=10, first_step=0, tensor_names=["w"])
    trace.add_losses(losses)
    return trace


@pytest.mark.parametrize(
    "losses",
    [
        np.zeros(0, np.float32),
        np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, 1e-45, 3.4e38], np.float32),
        training_like_losses(1875),
        np.random.default_rng(1).integers(0, 2**32, 5000, dtype=np.uint64).astype(np.uint32).view(np.float32),
    ],
    ids=["empty", "special values", "training", "random bits"],
)
def test_every_loss_bit_survives_the_round_trip(losses):
    value = json.loads(json.dumps(trace_of(losses).to_json()))
    assert value["version"] == TRACE_VERSION == 2 and set(LOSS_KEYS.values()) & set(value) == {KEY}
    back = StepTrace.from_json(value, "t", CheckpointError)
    assert back.losses.view(np.uint32).tolist() == losses.view(np.uint32).tolist()
    assert back.to_json() == value


def test_a_training_runs_losses_take_about_three_bytes_a_step():
    losses = training_like_losses(1875)
    encoded = encode_losses(losses)
    plain = base64.b64encode(losses.astype("<f4").tobytes()).decode()
    assert len(encoded) < 0.85 * len(plain), (len(encoded), len(plain))


def test_a_version_1_trace_is_still_read():
    losses = training_like_losses(300, seed=2)
    value = trace_of(losses).to_json()
    old = {k: v for k, v in value.items() if k != KEY}
    old.update(version=1, loss_f32_le_base64=base64.b64encode(losses.astype("<f4").tobytes()).decode())
    back = StepTrace.from_json(old, "t", CheckpointError)
    assert back.losses.view(np.uint32).tolist() == losses.view(np.uint32).tolist()
    assert back.to_json() == value  # written again as version 2
    # A key of the other version is refused, not ignored.
    with pytest.raises(CheckpointError, match="^t.loss_f32_le_base64 is not a key of a version 2 trace$"):
        StepTrace.from_json({**value, "loss_f32_le_base64": old["loss_f32_le_base64"]}, "t", CheckpointError)
    with pytest.raises(CheckpointError, match="trace version 3 is not one this reprocube reads"):
        StepTrace.from_json({**value, "version": 3}, "t", CheckpointError)


def _deflated(data: bytes) -> str:
    compressor = zlib.compressobj(9, zlib.DEFLATED, -15)
    return base64.b64encode(compressor.compress(data) + compressor.flush()).decode()


def test_a_damaged_or_hostile_loss_encoding_is_one_line_naming_the_key():
    losses = training_like_losses(400, seed=3)
    good = trace_of(losses).to_json()
    text = good[KEY]
    cases = {
        "not base64": ("***", "is not base64"),
        "missing": (None, f"{KEY} must be a string, got <absent>"),
        "cut short": (text[: len(text) // 2 // 4 * 4], "does not hold exactly 400 steps' losses"),
        "one step short": (_deflated(bytes(4 * 399)), "does not hold exactly 400 steps' losses"),
        "one byte more": (_deflated(bytes(4 * 400 + 1)), "does not hold exactly 400 steps' losses"),
        "half the steps": (_deflated(bytes(800)), "does not hold exactly 400 steps' losses"),
        "not deflate": (base64.b64encode(b"\xff" * 64).decode(), "is not a deflate stream"),
        "zlib header": (base64.b64encode(zlib.compress(bytes(1600))).decode(), "deflate"),
    }
    raw = base64.b64decode(_deflated(bytes(1600)))
    cases["data after the stream"] = (base64.b64encode(raw + b"junk").decode(), "in one deflate stream")
    for name, (value, message) in cases.items():
        bad = {k: v for k, v in good.items() if k != KEY}
        if value is not None:
            bad[KEY] = value
        with pytest.raises(CheckpointError) as caught:
            StepTrace.from_json(bad, "t", CheckpointError)
        line = str(caught.value)
        assert line.startswith("t") and message in line and "\n" not in line, (name, line)


def test_a_small_trace_cannot_claim_hundreds_of_mb_of_losses():
    """Zeros deflate about 1000:1: a 200 KB receipt could otherwise make its reader expand 200 MB."""
    steps = 50_000_000
    bomb = _deflated(bytes(4 * steps))
    with pytest.raises(CheckpointError, match="deflated bytes cannot hold 50000000 steps' losses"):
        decode_losses(bomb, steps, "t", CheckpointError)
    # Within the bound, a run whose losses repeat exactly (here: all zero) is read.
    assert decode_losses(_deflated(bytes(4 * 4000)), 4000, "t", CheckpointError).tolist() == [0.0] * 4000


@pytest.mark.parametrize("steps", [16_000, 20_000, 200_000])
def test_losses_that_repeat_past_the_bound_are_written_so_that_they_read_back(steps):
    """Constant losses deflate about 1000:1, past what a reader expands: the writer stores them instead."""
    losses = np.full(steps, 0.25, np.float32)
    losses[::7] = 0.5
    value = json.loads(json.dumps(trace_of(losses).to_json()))
    back = StepTrace.from_json(value, "t", CheckpointError)
    assert back.losses.view(np.uint32).tolist() == losses.view(np.uint32).tolist()
