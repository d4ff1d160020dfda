"""Checkpoint files: atomic writes, and refusal of anything changed, missing or added."""

from __future__ import annotations

import json

import numpy as np
import pytest

from reprocube.errors import CheckpointError
from reprocube.training.checkpoint import (
    CheckpointContent,
    latest_checkpoint,
    read_checkpoint,
    weights_digest,
    write_checkpoint,
)

# What every manifest carries besides the files (reprocube.training.state writes them; read_manifest checks them).
MANIFEST_FIELDS = {
    "epoch": 1,
    "step_in_epoch": 0,
    "global_step": 5,
    "steps_per_epoch": 5,
    "metrics": {"epochs": [], "steps": []},
}


def _fields(**changes) -> dict:
    return {**MANIFEST_FIELDS, **changes}


def _content() -> CheckpointContent:
    rng = np.random.default_rng(0)
    return CheckpointContent(
        weights={"fc.weight": rng.standard_normal((3, 4), dtype=np.float32), "fc.bias": np.zeros(3, np.float32)},
        optimizer={"momentum_buffer.fc.weight": np.ones((3, 4), np.float32)},
        rng={"torch.cpu": np.arange(16, dtype=np.uint8)},
        state={"position": {"epoch": 1, "step_in_epoch": 0, "global_step": 5}},
        config={"seed": 0},
    )


@pytest.fixture
def checkpoint(tmp_path):
    return write_checkpoint(tmp_path / "checkpoints", "epoch-0001", _content(), MANIFEST_FIELDS)


def test_round_trip(checkpoint):
    loaded = read_checkpoint(checkpoint)
    original = _content()
    assert loaded.manifest.weights_digest == weights_digest(original.weights)
    for name, array in original.weights.items():
        assert loaded.content.weights[name].tobytes() == array.tobytes()
    assert loaded.content.state == original.state
    assert sorted(p.name for p in checkpoint.parent.iterdir()) == ["epoch-0001"]  # no temporaries left


def test_weights_digest_sees_every_bit_name_and_shape():
    weights = _content().weights
    base = weights_digest(weights)
    flipped = weights["fc.weight"].copy()
    flipped.view(np.uint32)[0, 0] ^= 1  # one ulp
    assert weights_digest({**weights, "fc.weight": flipped}) != base
    assert weights_digest({"fc.w": weights["fc.weight"], "fc.bias": weights["fc.bias"]}) != base
    assert weights_digest({**weights, "fc.weight": weights["fc.weight"].reshape(4, 3)}) != base
    assert weights_digest(dict(reversed(list(weights.items())))) == base  # order-independent


@pytest.mark.parametrize(
    "name", ["weights.safetensors", "optimizer.safetensors", "rng.safetensors", "state.json", "config.json"]
)
def test_a_changed_byte_is_refused(checkpoint, name):
    path = checkpoint / name
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=f"{name} does not match its sha256"):
        read_checkpoint(checkpoint)


def test_an_edited_manifest_is_refused(checkpoint):
    path = checkpoint / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["global_step"] = 6
    path.write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match="manifest_sha256 does not match"):
        read_checkpoint(checkpoint)


@pytest.mark.parametrize("name", ["rng.safetensors", "manifest.json", "config.json"])
def test_a_missing_file_is_refused(checkpoint, name):
    (checkpoint / name).unlink()
    with pytest.raises(CheckpointError, match="missing"):
        read_checkpoint(checkpoint)


def test_an_unlisted_file_is_refused(checkpoint):
    (checkpoint / "extra.pkl").write_bytes(b"\x80\x04")
    with pytest.raises(CheckpointError, match="does not list: 'extra.pkl'"):
        read_checkpoint(checkpoint)


def test_an_existing_checkpoint_is_never_overwritten(checkpoint):
    before = (checkpoint / "weights.safetensors").read_bytes()
    with pytest.raises(CheckpointError, match="already exists"):
        write_checkpoint(checkpoint.parent, "epoch-0001", _content(), _fields(global_step=9))
    assert (checkpoint / "weights.safetensors").read_bytes() == before


def test_latest_ignores_temporaries_and_prefers_the_epoch_checkpoint(tmp_path):
    directory = tmp_path / "checkpoints"
    write_checkpoint(directory, "step-000005", _content(), _fields(global_step=5))
    write_checkpoint(directory, "epoch-0001", _content(), _fields(global_step=5))
    write_checkpoint(directory, "step-000003", _content(), _fields(global_step=3))
    (directory / ".tmp-epoch-0002-123").mkdir()  # a write cut short by a crash
    assert latest_checkpoint(directory).name == "epoch-0001"


def test_scalars_keep_their_shape(tmp_path):
    content = _content()
    content.optimizer["iteration"] = np.array(7, dtype=np.int64)
    content.weights["scale"] = np.array(1.5, dtype=np.float32)
    loaded = read_checkpoint(write_checkpoint(tmp_path, "epoch-0001", content, _fields(global_step=1)))
    assert loaded.content.optimizer["iteration"].shape == () and loaded.content.weights["scale"].shape == ()


def test_a_manifest_key_outside_the_schema_is_refused_before_anything_is_written(tmp_path):
    with pytest.raises(ValueError, match="not in the manifest's schema"):
        write_checkpoint(tmp_path / "checkpoints", "epoch-0001", _content(), _fields(surprise=1))
    assert not (tmp_path / "checkpoints").exists()


def test_every_manifest_key_written_is_in_the_schema(tmp_path):
    from reprocube.training.checkpoint import MANIFEST_FIELD_KEYS, MANIFEST_OWN_KEYS

    path = write_checkpoint(tmp_path / "checkpoints", "epoch-0001", _content(), MANIFEST_FIELDS)
    written = json.loads((path / "manifest.json").read_text())
    assert set(written) <= set(MANIFEST_FIELD_KEYS) | set(MANIFEST_OWN_KEYS)
    assert set(MANIFEST_OWN_KEYS) <= set(written)
