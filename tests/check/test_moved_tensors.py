"""formats/moved_tensors.py: what check's moved-weights restart is given. Every floating-point value of a
checkpoint moved by one (finite), read back by the library that wrote it; integers, RNG states and other files left
byte for byte; a file that claims a format and lies about its sizes refused before anything is allocated."""

from __future__ import annotations

import hashlib
import os
import zipfile

import numpy as np
import pytest

from reprocube.errors import CheckpointError
from reprocube.formats.checkpoint_formats import move_by_one


def digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_npy_floats_move_by_one_and_integers_are_left(tmp_path):
    w = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.save(tmp_path / "w.npy", w, allow_pickle=False)
    np.save(tmp_path / "f.npy", np.asfortranarray(w))
    np.save(tmp_path / "step.npy", np.arange(3))
    before = digest(tmp_path / "step.npy")
    assert (
        move_by_one(tmp_path / "w.npy") == 1
        and move_by_one(tmp_path / "f.npy") == 1
        and move_by_one(tmp_path / "step.npy") == 0
    )
    for name in ("w.npy", "f.npy"):
        moved = np.load(tmp_path / name)
        assert moved.dtype == np.float32 and np.array_equal(moved, w + 1), name
    assert digest(tmp_path / "step.npy") == before


@pytest.mark.parametrize("save", [np.savez, np.savez_compressed])
def test_npz_members_keep_their_compression_and_only_floats_change(tmp_path, save):
    rng_state = np.random.default_rng(0).integers(0, 2**32, size=4, dtype=np.uint32)
    save(tmp_path / "ckpt.npz", w=np.ones((3, 3)), half=np.ones(2, np.float16), step=np.array(7), rng=rng_state)
    methods = {i.filename: i.compress_type for i in zipfile.ZipFile(tmp_path / "ckpt.npz").infolist()}
    assert move_by_one(tmp_path / "ckpt.npz") == 2
    assert {i.filename: i.compress_type for i in zipfile.ZipFile(tmp_path / "ckpt.npz").infolist()} == methods
    with np.load(tmp_path / "ckpt.npz") as loaded:
        assert (loaded["w"] == 2).all() and (loaded["half"] == 2).all() and np.isfinite(loaded["w"]).all()
        assert loaded["step"] == 7 and (loaded["rng"] == rng_state).all()


def test_torch_storages_of_floats_become_nan_and_the_rest_loads_as_saved(tmp_path):
    torch = pytest.importorskip("torch")
    model = torch.nn.Linear(3, 2)
    torch.manual_seed(0)
    saved = {
        "model": model.state_dict(),
        "step": 5,
        "rng": torch.get_rng_state(),
        "ids": torch.arange(4),
        "half": torch.ones(2, dtype=torch.bfloat16),
    }
    torch.save(saved, tmp_path / "ckpt.pt")
    assert move_by_one(tmp_path / "ckpt.pt") == 3  # weight, bias, the bfloat16 tensor
    loaded = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    assert all(torch.equal(loaded["model"][k], v + 1) for k, v in saved["model"].items())
    assert torch.equal(loaded["half"], saved["half"] + 1)
    assert loaded["step"] == 5 and torch.equal(loaded["rng"], saved["rng"]) and torch.equal(loaded["ids"], saved["ids"])
    model.load_state_dict(loaded["model"])  # what a restart does: the library reads the new file


def test_safetensors_floats_move_in_place(tmp_path):
    safetensors = pytest.importorskip("safetensors.numpy")
    safetensors.save_file({"w": np.ones(4, np.float32), "n": np.arange(3)}, tmp_path / "m.safetensors")
    size = (tmp_path / "m.safetensors").stat().st_size
    assert move_by_one(tmp_path / "m.safetensors") == 1
    loaded = safetensors.load_file(tmp_path / "m.safetensors")
    assert (loaded["w"] == 2).all() and (loaded["n"] == np.arange(3)).all()
    assert (tmp_path / "m.safetensors").stat().st_size == size


def test_other_files_are_left_untouched(tmp_path):
    for name, blob in {"state.json": b'{"step": 3}', "x.pkl": b"\x80\x04K\x03.", "empty": b""}.items():
        (tmp_path / name).write_bytes(blob)
        assert move_by_one(tmp_path / name) is None
        assert (tmp_path / name).read_bytes() == blob
    with zipfile.ZipFile(tmp_path / "a.zip", "w") as archive:
        archive.writestr("notes.txt", "hello")
    assert move_by_one(tmp_path / "a.zip") is None


def test_a_header_that_declares_more_than_the_file_holds_is_refused_and_the_file_left(tmp_path):
    """A 2**33-element header over 16 bytes: refused before anything is allocated, the file as it was."""
    header = "{'descr': '<f8', 'fortran_order': False, 'shape': (8589934592,), }"
    blob = b"\x93NUMPY\x01\x00" + len(header + "\n").to_bytes(2, "little") + (header + "\n").encode() + bytes(16)
    (tmp_path / "big.npy").write_bytes(blob)
    with pytest.raises(CheckpointError, match="big.npy"):
        move_by_one(tmp_path / "big.npy")
    assert (tmp_path / "big.npy").read_bytes() == blob


def test_a_link_is_never_followed_nor_written_through(tmp_path):
    np.save(tmp_path / "real.npy", np.ones(3))
    before = digest(tmp_path / "real.npy")
    os.symlink(tmp_path / "real.npy", tmp_path / "link.npy")
    with pytest.raises(CheckpointError, match="symbolic link"):
        move_by_one(tmp_path / "link.npy")
    assert digest(tmp_path / "real.npy") == before and (tmp_path / "link.npy").is_symlink()


def test_an_npz_member_that_is_not_read_is_kept_and_the_others_move(tmp_path):
    """Round 9's H10: an RNG state saved as a dict (a pickled object member) made the whole file unmovable.
    It is kept byte for byte; the weights beside it move. The file keeps its mtime (a script may take its
    newest checkpoint by it: H6b)."""
    state = np.random.default_rng(0).bit_generator.state
    np.savez(tmp_path / "ckpt.npz", w=np.ones(3, np.float32), rng=state)
    os.utime(tmp_path / "ckpt.npz", ns=(1_000_000_000, 2_000_000_000))
    assert move_by_one(tmp_path / "ckpt.npz") == 1
    assert (tmp_path / "ckpt.npz").stat().st_mtime_ns == 2_000_000_000
    with np.load(tmp_path / "ckpt.npz", allow_pickle=True) as loaded:
        assert (loaded["w"] == 2).all() and loaded["rng"].item() == state
