"""Issue 53 item 5: every checkpoint format read without running or trusting it (reprocube.formats.tensor_readers).
`torch.save` files are read by a restricted unpickler (NumPy RNG states, argparse.Namespace, OrderedDict,
torch.Size and tensor views included) that imports and calls nothing a pickle names; every size a file
declares is checked against the file and a memory budget before anything is allocated. The hostile
files are built here; where memory is the claim, the real CLI runs in a child whose peak RSS is
measured, and the refusal must come in one line, fast."""

from __future__ import annotations

import argparse
import io
import json
import pickle
import struct
import subprocess
import sys
import time
import zipfile
import zlib
from collections import OrderedDict
from pathlib import Path

import h5py
import numpy as np
import pytest

from reprocube.analysis.output_content import content_difference
from reprocube.analysis.outputs import compare_outputs
from reprocube.errors import CheckpointError
from reprocube.formats.tensor_readers import MAX_DECODED_BYTES, read_npy, read_safetensors
from reprocube.formats.torch_pickle import read_torch

from helpers import reprocube

torch = pytest.importorskip("torch")


def saved(value) -> bytes:
    blob = io.BytesIO()
    torch.save(value, blob)
    return blob.getvalue()


def state(seed: int) -> dict:
    """What a resumable script saves: a state dict, NumPy's global generator, its arguments, a step."""
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    np.random.seed(seed)
    return {
        "model": model.state_dict(),
        "numpy_rng": np.random.get_state(),  # a tuple holding an ndarray: refused by weights_only=True
        "args": argparse.Namespace(lr=0.1, name="run"),
        "step": 7,
        "shape": torch.Size([2, 3]),
        "view": torch.arange(10.0)[2:8:2],  # a strided view of a larger storage
        "half": torch.ones(2, dtype=torch.bfloat16),
        "extra": OrderedDict(a=1.5),
    }


@pytest.mark.process
def test_a_torch_save_with_numpy_rng_and_namespace_is_read_without_torch_load(tmp_path):
    """torch.load(weights_only=True) refused np.random.get_state() and the UnpicklingError was a
    traceback; now every value is read (as torch.load(weights_only=False) would build it) and compared."""
    value = state(0)
    flat = read_torch(saved(value), "ckpt.pt")
    assert np.array_equal(flat["model.weight"], value["model"]["weight"].numpy())
    assert np.array_equal(flat["numpy_rng.1"], value["numpy_rng"][1]) and flat["numpy_rng.1"].dtype == np.uint32
    assert np.array_equal(flat["view"], [2.0, 4.0, 6.0]) and flat["step"] == 7 and flat["args.lr"] == 0.1
    assert bytes(flat["args.name"]) == b"'run'" and (flat["shape.0"], flat["shape.1"]) == (2, 3)
    assert str(flat["half"].dtype) == "bfloat16" and flat["extra.a"] == 1.5
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    (a / "ckpt.pt").write_bytes(saved(state(0)))
    (b / "ckpt.pt").write_bytes(saved(state(1)))  # the same model, another NumPy generator state
    [entry] = compare_outputs(a, b, ["ckpt.pt"], [])["files"]
    assert entry["same"] is False and entry["tensor"]["tensor"] == "numpy_rng.1", entry
    proc = reprocube("diff", "a/ckpt.pt", "b/ckpt.pt", cwd=tmp_path, check=False)
    assert proc.returncode == 6 and "tensor numpy_rng.1" in proc.stdout and "Traceback" not in proc.stderr


def pickled_zip(pkl: bytes, storages: dict[str, bytes] | None = None) -> bytes:
    blob = io.BytesIO()
    with zipfile.ZipFile(blob, "w") as archive:
        archive.writestr("archive/data.pkl", pkl)
        archive.writestr("archive/byteorder", "little")
        for key, data in (storages or {}).items():
            archive.writestr(f"archive/data/{key}", data)
    return blob.getvalue()


@pytest.mark.process
def test_a_pickle_naming_any_other_global_is_refused_and_nothing_is_imported_or_run(tmp_path):
    marker = tmp_path / "ran"
    # GLOBAL os.system, called (REDUCE) with a command: refused at the global, never imported or called.
    evil = b"\x80\x02cos\nsystem\nq\x00X" + struct.pack("<I", len(f"touch {marker}")) + f"touch {marker}".encode()
    evil += b"q\x01\x85q\x02Rq\x03."
    with pytest.raises(CheckpointError, match=r"names os\.system, which is not read"):
        read_torch(pickled_zip(evil), "evil.pt")
    assert not marker.exists()
    assert "this" not in sys.modules  # a module never imported here: a pickle naming it leaves it so
    with pytest.raises(CheckpointError, match=r"this\.s"):
        read_torch(pickled_zip(b"\x80\x02cthis\ns\n."), "t.pt")
    assert "this" not in sys.modules
    # A global whose name holds terminal control sequences: shown escaped, in one line, by the CLI.
    (tmp_path / "a.pt").write_bytes(pickled_zip(b"\x80\x02c\x1b[2J\x1b[1;1Hverdict: ok\nx\n)R."))
    (tmp_path / "b.pt").write_bytes(saved({"w": torch.ones(1)}))
    proc = reprocube("diff", "a.pt", "b.pt", cwd=tmp_path, check=False)
    assert proc.returncode == 6 and "\x1b" not in proc.stdout and "\\x1b[2J" in proc.stdout, proc.stdout
    assert "Traceback" not in proc.stderr and len(proc.stdout.splitlines()) == 2


class _Storage:
    """Pickled as torch.save pickles a storage: a persistent id naming its archive member."""

    def __init__(self, numel: int):
        self.numel = numel


class _Tensor:
    """Pickled as torch.save pickles a tensor: _rebuild_tensor_v2(storage, offset, size, stride, ...)."""

    def __init__(self, storage: _Storage, offset: int, size: tuple, stride: tuple):
        self.args = (storage, offset, size, stride, False, OrderedDict())

    def __reduce__(self):
        return torch._utils._rebuild_tensor_v2, self.args


class _Pickler(pickle.Pickler):
    def persistent_id(self, obj):
        return ("storage", torch.FloatStorage, "0", "cpu", obj.numel) if isinstance(obj, _Storage) else None


def test_storages_and_strides_are_checked_against_the_archive():
    def rebuilt(offset: int, size: tuple, stride: tuple, numel: int = 4) -> bytes:
        blob = io.BytesIO()
        _Pickler(blob, protocol=2).dump(_Tensor(_Storage(numel), offset, size, stride))
        return pickled_zip(blob.getvalue(), {"0": np.arange(4, dtype=np.float32).tobytes()})

    assert np.array_equal(read_torch(rebuilt(1, (3,), (1,)), "ok.pt")["tensor"], [1.0, 2.0, 3.0])
    with pytest.raises(CheckpointError, match="reaches past its storage"):
        read_torch(rebuilt(1, (2, 2), (2, 1)), "strided.pt")
    with pytest.raises(CheckpointError, match="storage 0 of 100 x float32 holds 16 bytes"):
        read_torch(rebuilt(0, (4,), (1,), numel=100), "numel.pt")
    with pytest.raises(CheckpointError, match="not a zip-format torch.save file"):
        read_torch(pickle.dumps({"w": 1}), "legacy.pt")


def npy_header(shape: tuple, descr: str = "<f8") -> bytes:
    text = f"{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}".encode()
    text += b" " * (63 - (len(text) + 10) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(text)) + text


@pytest.mark.process
def test_an_npy_declaring_more_than_it_holds_is_one_line_at_once(tmp_path):
    """A 145-byte .npy declaring 2**33 float64 was a MemoryError traceback."""
    hostile = npy_header((2**33,)) + b"\x00" * 17
    assert len(hostile) == 145
    with pytest.raises(
        CheckpointError, match=r"declares \(8589934592,\) float64 \(68719476736 bytes\); the file holds 17"
    ):
        read_npy(hostile, "x.npy")
    (tmp_path / "a.npy").write_bytes(hostile)
    np.save(tmp_path / "b.npy", np.ones(2))
    started = time.perf_counter()
    proc = reprocube("diff", "a.npy", "b.npy", cwd=tmp_path, check=False)
    assert proc.returncode == 6 and "could not be read as .npy" in proc.stdout and "Traceback" not in proc.stderr
    assert time.perf_counter() - started < 60  # a fresh interpreter; the refusal itself is instant
    with pytest.raises(CheckpointError, match="not read"):
        read_npy(npy_header((2,), "|O"), "objects.npy")  # a pickle inside: never read


def test_safetensors_are_parsed_here_every_offset_checked():
    from safetensors.numpy import save

    good = save({"w": np.arange(6, dtype=np.float32).reshape(2, 3)})
    assert np.array_equal(read_safetensors(good, "s")["w"], np.arange(6).reshape(2, 3))
    with pytest.raises(CheckpointError, match="the header declares 1000000 bytes"):
        read_safetensors(struct.pack("<Q", 10**6) + good[8:], "lying.safetensors")  # a traceback before
    header = json.dumps({"w": {"dtype": "F32", "shape": [1 << 40], "data_offsets": [0, 1 << 42]}}).encode()
    with pytest.raises(CheckpointError, match="outside the 24 data bytes"):
        read_safetensors(struct.pack("<Q", len(header)) + header + b"\x00" * 24, "offsets.safetensors")


def test_an_expanded_view_is_charged_to_the_budget_before_it_is_copied_out():
    """torch.zeros(1).expand(2**28), three times in a 2 KB file, was copied out contiguous with no budget
    (8 GB of memory, 49 s): each copy of a view is charged first; small views and transposes still read."""
    bomb = saved({f"m{i}": torch.zeros(1).expand(2**28) for i in range(3)} | {"w": torch.ones(1)})
    assert len(bomb) < 4096
    started = time.perf_counter()
    with pytest.raises(CheckpointError, match=f"with strides \\(0,\\) declares {2**30} bytes, past the"):
        read_torch(bomb, "ckpt.pt")
    assert time.perf_counter() - started < 5
    flat = read_torch(saved({"e": torch.arange(2.0).expand(3, 2), "t": torch.arange(6.0).reshape(2, 3).T}), "ok.pt")
    assert np.array_equal(flat["e"], [[0, 1]] * 3) and np.array_equal(flat["t"], np.arange(6.0).reshape(2, 3).T)


def peak(args: list[str], cwd: Path) -> tuple[subprocess.CompletedProcess, float, float]:
    """The CLI in a child: its result, peak RSS in MiB and seconds."""
    code = (
        "import resource, subprocess, sys, time, json; t = time.perf_counter(); "
        f"p = subprocess.run([sys.executable, '-m', 'reprocube', *{args!r}], capture_output=True, text=True); "
        "print(json.dumps([p.returncode, p.stdout, p.stderr, "
        "resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024, time.perf_counter() - t]))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=300, check=True)
    rc, stdout, stderr, mib, seconds = json.loads(out.stdout)
    return subprocess.CompletedProcess(args, rc, stdout, stderr), mib, seconds


def npz_bomb(inflated: int, declared: int) -> bytes:
    """An .npz whose one member inflates to `inflated` bytes (an .npy of float64 zeros) from about
    inflated/1000 bytes, its zip headers declaring `declared` bytes: built by hand, in a moment (each MiB
    of zeros deflated once, after a full flush, then repeated)."""
    header = npy_header(((inflated - 128) // 8,))
    compressor = zlib.compressobj(9, zlib.DEFLATED, -15)
    start = compressor.compress(header) + compressor.flush(zlib.Z_FULL_FLUSH)
    block = compressor.compress(bytes(1 << 20)) + compressor.flush(zlib.Z_FULL_FLUSH)
    data = start + block * ((inflated - len(header)) // (1 << 20)) + compressor.flush()
    name = b"w.npy"
    local = struct.pack("<IHHHHHIIIHH", 0x04034B50, 20, 0, 8, 0, 0, 0, len(data), declared, len(name), 0)
    central = struct.pack(
        "<IHHHHHHIIIHHHHHII", 0x02014B50, 20, 20, 0, 8, 0, 0, 0, len(data), declared, len(name), 0, 0, 0, 0, 0, 0
    )
    directory = central + name
    end = struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, 1, 1, len(directory), len(local) + len(name) + len(data), 0)
    return local + name + data + directory + end


@pytest.mark.process
def test_an_npz_inflating_to_3_gib_and_an_hdf5_declaring_2_gib_are_refused_with_little_memory(tmp_path):
    """A 3 MB .npz inflating to 3 GiB (declared honestly: refused at its declared size; declared small:
    the inflation stops there) and a 1.4 KB .h5 declaring 16384x16384 float64 with a fill value and no
    storage (it took 2.1 GB): each refused in one line, the CLI's peak RSS far below what they declare."""
    gib3 = 3 << 30
    (tmp_path / "honest.npz").write_bytes(npz_bomb(gib3, gib3))
    (tmp_path / "lying.npz").write_bytes(npz_bomb(gib3, 4096))
    assert (tmp_path / "honest.npz").stat().st_size < 4 << 20
    np.savez(tmp_path / "fine.npz", w=np.ones(3))
    with h5py.File(tmp_path / "fill.h5", "w") as file:
        file.create_dataset("w", shape=(16384, 16384), dtype="f8", fillvalue=1.0)
    with h5py.File(tmp_path / "fine.h5", "w") as file:
        file["w"] = np.ones(3)
    assert (tmp_path / "fill.h5").stat().st_size < 4096
    for hostile, fine, message in (
        ("honest.npz", "fine.npz", f"w.npy declares {gib3} bytes, past the {MAX_DECODED_BYTES} bytes"),
        ("lying.npz", "fine.npz", "w.npy cannot be read"),  # stopped at its declared 4096 bytes: bad CRC
        ("fill.h5", "fine.h5", f"dataset w declares {16384 * 16384 * 8} bytes, past the"),
    ):
        proc, mib, seconds = peak(["diff", hostile, fine], tmp_path)
        [line] = [line for line in proc.stdout.splitlines() if line.startswith(hostile + ":")]
        assert proc.returncode == 6 and "could not be read as" in line and message in line, proc.stdout + proc.stderr
        assert "Traceback" not in proc.stderr and mib < 600 and seconds < 120, (hostile, mib, seconds)


def test_a_reader_error_is_a_difference_named_never_an_exception():
    """content_difference never raises: a corrupt file of every format is a difference that says why."""
    for suffix in (".pt", ".npz", ".npy", ".safetensors", ".h5", ".keras"):
        entry = content_difference(f"x{suffix}", b"garbage \x1b[2J", b"other")
        assert entry["detail"].startswith(f"the bytes differ; the file could not be read as {suffix}")
        assert "\x1b" not in entry["detail"]


def test_an_orbax_checkpoint_is_checked_against_the_budget_by_its_metadata_before_orbax_restores(tmp_path, monkeypatch):
    """Orbax allocates what its array metadata declares (a shape edit cost 8 GiB): the shapes Orbax's
    metadata reports are charged to the budget first; past it, restore is never called."""
    ocp = pytest.importorskip("orbax.checkpoint")
    from reprocube.formats import output_files as outputs
    from reprocube.formats import tensor_readers as readers

    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save((tmp_path / "ckpt").absolute(), {"w": np.ones((4, 3), np.float32), "b": np.zeros(5)})
    checkpointer.wait_until_finished()
    assert set(outputs.load_orbax(tmp_path / "ckpt")) == {"w", "b"}
    monkeypatch.setattr(readers, "MAX_DECODED_BYTES", 60)  # b (40 bytes) fits, then w (48) does not
    monkeypatch.setattr(ocp.StandardCheckpointer, "restore", lambda *a, **k: pytest.fail("restored"))
    with pytest.raises(CheckpointError, match="w declares 48 bytes, past the 60 bytes"):
        outputs.load_orbax(tmp_path / "ckpt")


def test_a_state_dicts_metadata_is_not_counted_as_tensors():
    """A 2-tensor model's state dict as torch.save writes it: its `_metadata` version entries are no tensors
    (a 4-tensor model once read "4 of 10 tensors differ"); where they differ, they are counted apart."""
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    a = saved({"model": model.state_dict()})
    with torch.no_grad():
        model.bias.add_(1.0)
    b_state = model.state_dict()
    assert content_difference("m.pt", a, saved({"model": b_state}))["detail"].endswith("(1 of 2 tensors differ)")
    b_state._metadata[""]["version"] = 2  # a module saved by another torch version
    detail = content_difference("m.pt", a, saved({"model": b_state}))["detail"]
    assert detail.startswith("tensor model.bias: ") and detail.endswith(
        "(1 of 2 tensors differ; 1 metadata entry differs too)"
    )


def test_plain_values_saved_beside_the_weights_are_not_counted_as_tensors():
    """A checkpoint holding the step, the learning rate and a name beside 2 tensors: 2 tensors, not 5; a
    differing step is named as a value with both numbers, a differing name as other text (issue 66 item 6)."""
    weights = {"w": torch.ones(3), "b": torch.zeros(2)}
    a = saved({**weights, "step": 3, "lr": 0.1, "name": "run-a"})
    moved = {"w": torch.ones(3) * 2, "b": torch.zeros(2)}
    detail = content_difference("c.pt", a, saved({**moved, "step": 3, "lr": 0.1, "name": "run-a"}))["detail"]
    assert detail.startswith("tensor w: ") and detail.endswith("(1 of 2 tensors differ)"), detail
    detail = content_difference("c.pt", a, saved({**weights, "step": 4, "lr": 0.1, "name": "run-b"}))["detail"]
    assert detail == "value name: other text (0 of 2 tensors differ; 2 other values differ (name, step))", detail
    detail = content_difference("c.pt", a, saved({**moved, "step": 4, "lr": 0.1, "name": "run-a"}))["detail"]
    assert detail.startswith("tensor w: ") and detail.endswith("(1 of 2 tensors differ; 1 other value differs (step))")
    detail = content_difference("c.pt", a, saved({**weights, "step": 4, "lr": 0.1, "name": "run-a"}))["detail"]
    assert detail == "value step: 3 vs 4 (0 of 2 tensors differ; 1 other value differs (step))", detail
