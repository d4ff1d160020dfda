"""Tensor files read without running or trusting them, for reprocube.analysis.outputs and reprocube.formats.output_files: NumPy `.npy`/`.npz`,
safetensors, HDF5 (Keras `.h5`/`.weights.h5`), Keras 3 `.keras` archives and `torch.save` checkpoints
(the zip format), each into {name: numpy array}.

Every size a file declares is checked before anything is allocated: against the bytes the file holds
(an `.npy` header's shape x itemsize, a safetensors offset, a torch storage's element count) and against
a budget of decoded bytes per file (MAX_DECODED_BYTES: an `.npz` member's declared size, an HDF5
dataset's shape x itemsize, fill-valued datasets included). Zip members are read only up to their
declared size, so a member that inflates past it stops there.

A `torch.save` pickle is read by a restricted unpickler that never imports or calls anything the pickle
names: `find_class` returns an inert stand-in for a short allow-list (tensors rebuilt from storages,
NumPy arrays and dtypes, OrderedDict, argparse.Namespace, torch.Size, bytes) and refuses every other
global, naming it (escaped). The stand-ins build plain data with our own code: arrays from bytes whose
length, offsets and strides are checked. Torch is not imported.

Every failure is one CheckpointError naming the file."""

from __future__ import annotations

import io
import math
import zipfile

import numpy as np

from reprocube.errors import CheckpointError
from reprocube.terminal import one_line
from reprocube.untrusted import parse_json

MAX_DECODED_BYTES = 1 << 30  # per file: what the arrays read from it may take beyond its own bytes
MAX_MEMBERS = 100_000  # zip members, HDF5 datasets
MAX_HEADER_BYTES = 100 << 20  # a safetensors JSON header, a torch data.pkl
MAX_DIMS = 64
MAX_VALUES = 1_000_000  # named values in one pickle (a pickle can share one list a billion times)
MAX_NESTING = 100
ZIP_METHODS = (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED)  # what np.savez, torch.save and Keras write
# what zipfile raises on a damaged or hostile archive (NotImplementedError: a version or method it lacks)
ZIP_ERRORS = (zipfile.BadZipFile, ValueError, OSError, EOFError, RuntimeError, NotImplementedError)


class Budget:
    """Decoded bytes charged before they are allocated; past `limit`, the file is refused."""

    def __init__(self, where: str, limit: int | None = None):
        self.where, self.limit, self.used = where, MAX_DECODED_BYTES if limit is None else limit, 0

    def charge(self, nbytes: int, what: str) -> None:
        self.used += nbytes
        if self.used > self.limit:
            raise CheckpointError(
                f"{self.where}: {what} declares {nbytes} bytes, past the {self.limit} bytes one file may decode"
            )


def element_count(shape, where: str) -> int:
    """The number of elements of a declared shape: a list of at most MAX_DIMS integers >= 0."""
    if not isinstance(shape, list | tuple) or len(shape) > MAX_DIMS:
        raise CheckpointError(f"{where}: the shape {short(shape)} is not a list of at most {MAX_DIMS} sizes")
    if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape):
        raise CheckpointError(f"{where}: the shape {short(shape)} is not a list of sizes >= 0")
    return math.prod(shape)


def short(value) -> str:
    text = one_line(repr(value))
    return text if len(text) <= 60 else text[:57] + "..."


def _numeric(dtype: np.dtype, where: str) -> np.dtype:
    if dtype.hasobject or dtype.kind not in "biufcSU" or dtype.itemsize == 0:
        raise CheckpointError(f"{where}: the dtype {short(str(dtype))} is not read (numbers and fixed strings only)")
    return dtype


# --- NumPy ----------------------------------------------------------------------------------------------
def read_npy(data: bytes, where: str) -> np.ndarray:
    """An `.npy` file's array, a view of `data`: its header parsed by NumPy's literal reader (no pickle),
    its shape x itemsize equal to the bytes that follow the header."""
    stream = io.BytesIO(data)
    try:
        version = np.lib.format.read_magic(stream)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(stream, max_header_size=10_000)
        elif version == (2, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(stream, max_header_size=10_000)
        else:
            raise ValueError(f"format version {version} is not read")
    except (ValueError, SyntaxError, TypeError, EOFError, OverflowError) as exc:
        raise CheckpointError(f"{where}: not a NumPy .npy header ({short(str(exc))})") from None
    dtype = _numeric(dtype, where)
    count = element_count(shape, where)
    offset = stream.tell()
    if count * dtype.itemsize != len(data) - offset:
        raise CheckpointError(
            f"{where}: the header declares {short(shape)} {dtype} ({count * dtype.itemsize} bytes); "
            f"the file holds {len(data) - offset}"
        )
    array = np.frombuffer(data, dtype=dtype, count=count, offset=offset)
    return array.reshape(shape, order="F" if fortran else "C")


def zip_members(data: bytes, where: str, budget: Budget) -> dict[str, bytes]:
    """name -> bytes of every member of a zip archive: stored or deflated only, each read only up to its
    declared size, the sizes charged to `budget` before anything is inflated."""
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except ZIP_ERRORS as exc:
        raise CheckpointError(f"{where}: not a zip archive ({short(str(exc))})") from None
    members: dict[str, bytes] = {}
    with archive:
        infos = archive.infolist()
        if len(infos) > MAX_MEMBERS:
            raise CheckpointError(f"{where}: more than {MAX_MEMBERS} members")
        for info in infos:
            name = one_line(info.filename)
            if info.compress_type not in ZIP_METHODS:
                raise CheckpointError(f"{where}: {name} is compressed with method {info.compress_type} (not read)")
            if info.is_dir():
                continue
            budget.charge(info.file_size, name)  # before a byte is inflated
            try:
                with archive.open(info) as member:
                    blob = member.read(info.file_size + 1)  # zipfile stops at the declared size
            except ZIP_ERRORS as exc:
                raise CheckpointError(f"{where}: {name} cannot be read ({short(str(exc))})") from None
            if len(blob) != info.file_size:
                raise CheckpointError(f"{where}: {name} holds {len(blob)} bytes, not the {info.file_size} declared")
            members[info.filename] = blob
    return members


def read_npz(data: bytes, where: str, budget: Budget | None = None) -> dict[str, np.ndarray]:
    """An `.npz` archive's arrays by name (each member an .npy, without pickles)."""
    budget = budget or Budget(where)
    arrays = {}
    for name, blob in zip_members(data, where, budget).items():
        arrays[name[:-4] if name.endswith(".npy") else name] = read_npy(blob, f"{where}: {one_line(name)}")
    return arrays


# --- safetensors ----------------------------------------------------------------------------------------
def safetensors_dtypes() -> dict[str, np.dtype]:
    dtypes = {
        "BOOL": np.dtype(np.bool_),
        "U8": np.dtype("u1"),
        "I8": np.dtype("i1"),
        "U16": np.dtype("<u2"),
        "I16": np.dtype("<i2"),
        "U32": np.dtype("<u4"),
        "I32": np.dtype("<i4"),
        "U64": np.dtype("<u8"),
        "I64": np.dtype("<i8"),
        "F16": np.dtype("<f2"),
        "F32": np.dtype("<f4"),
        "F64": np.dtype("<f8"),
        "BF16": np.dtype("<u2"),  # its bits, where ml_dtypes is absent
        "F8_E4M3": np.dtype("u1"),
        "F8_E5M2": np.dtype("u1"),
    }
    try:
        import ml_dtypes  # JAX's own dtypes library: bfloat16 and float8 as NumPy dtypes

        dtypes.update(
            BF16=np.dtype(ml_dtypes.bfloat16),
            F8_E4M3=np.dtype(ml_dtypes.float8_e4m3fn),
            F8_E5M2=np.dtype(ml_dtypes.float8_e5m2),
        )
    except ImportError:
        pass
    return dtypes


def read_safetensors(data: bytes, where: str) -> dict[str, np.ndarray]:
    """A safetensors file's tensors, views of `data`: the 8-byte header length and the JSON header read
    here (strictly), every tensor's offsets checked against the bytes after the header and against its
    dtype and shape."""
    if len(data) < 8:
        raise CheckpointError(f"{where}: {len(data)} bytes, shorter than a safetensors header")
    length = int.from_bytes(data[:8], "little")
    if length > min(MAX_HEADER_BYTES, len(data) - 8):
        raise CheckpointError(f"{where}: the header declares {length} bytes; the file holds {len(data) - 8}")
    header = parse_json(data[8 : 8 + length], f"{where}: the safetensors header", CheckpointError)
    if not isinstance(header, dict):
        raise CheckpointError(f"{where}: the safetensors header is not a JSON object")
    body, dtypes, arrays = 8 + length, safetensors_dtypes(), {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        place = f"{where}: tensor {one_line(name)}"
        if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
            raise CheckpointError(f"{place}: not {{dtype, shape, data_offsets}}")
        dtype = dtypes.get(entry["dtype"]) if isinstance(entry["dtype"], str) else None
        if dtype is None:
            raise CheckpointError(f"{place}: the dtype {short(entry['dtype'])} is not read")
        count = element_count(entry["shape"], place)
        offsets = entry["data_offsets"]
        if not (
            isinstance(offsets, list)
            and len(offsets) == 2
            and all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
            and 0 <= offsets[0] <= offsets[1] <= len(data) - body
        ):
            raise CheckpointError(f"{place}: data_offsets {short(offsets)} outside the {len(data) - body} data bytes")
        if offsets[1] - offsets[0] != count * dtype.itemsize:
            raise CheckpointError(
                f"{place}: {short(entry['shape'])} {entry['dtype']} is {count * dtype.itemsize} bytes, "
                f"its offsets hold {offsets[1] - offsets[0]}"
            )
        arrays[name] = np.frombuffer(data, dtype=dtype, count=count, offset=body + offsets[0]).reshape(entry["shape"])
    return arrays


# --- HDF5 -----------------------------------------------------------------------------------------------
_HDF5_FILTERS = {1, 2, 3, 4, 5, 6, 32000}  # deflate, shuffle, fletcher32, szip, nbit, scaleoffset, lzf: built in


def read_hdf5(data: bytes, where: str, budget: Budget | None = None) -> dict[str, np.ndarray]:
    """Every dataset of an HDF5 file by path, each one's shape x itemsize (and its chunk's) charged to the
    budget before it is read; a dataset stored in another file (external or virtual) or through a filter
    HDF5 would load as a plugin is refused. Links are not followed (only the file's own objects)."""
    import h5py

    budget = budget or Budget(where)
    datasets = []

    def keep(key: str, item) -> None:
        if isinstance(item, h5py.Dataset):
            datasets.append((key, item))
            if len(datasets) > MAX_MEMBERS:
                raise CheckpointError(f"{where}: more than {MAX_MEMBERS} datasets")

    arrays: dict[str, np.ndarray] = {}
    try:
        with h5py.File(io.BytesIO(data), "r") as file:
            file.visititems(keep)
            for key, dataset in datasets:
                place = f"{where}: dataset {one_line(key)}"
                dtype = _numeric(dataset.dtype, place)
                if dataset.shape is None:  # an empty dataspace
                    arrays[key] = np.zeros(0, dtype)
                    continue
                if dataset.is_virtual or dataset.external:
                    raise CheckpointError(f"{place}: its data lies in another file (not read)")
                plist = dataset.id.get_create_plist()
                filters = {plist.get_filter(i)[0] for i in range(plist.get_nfilters())}
                if filters - _HDF5_FILTERS:
                    raise CheckpointError(f"{place}: filter {sorted(filters - _HDF5_FILTERS)[0]} is not built in")
                if dataset.chunks is not None and element_count(dataset.chunks, place) * dtype.itemsize > budget.limit:
                    raise CheckpointError(f"{place}: its chunks are larger than {budget.limit} bytes")
                budget.charge(element_count(dataset.shape, place) * dtype.itemsize, f"dataset {one_line(key)}")
                arrays[key] = np.asarray(dataset[()])
    except CheckpointError:
        raise
    except (OSError, ValueError, KeyError, TypeError, RuntimeError) as exc:
        raise CheckpointError(f"{where}: not a readable HDF5 file ({short(str(exc))})") from None
    return arrays


# --- Keras 3 .keras archives ----------------------------------------------------------------------------
KERAS_VOLATILE = ("date_saved",)  # metadata.json's keys that change with every save


def read_keras(data: bytes, where: str) -> dict:
    """A Keras 3 `.keras` archive: {"weights": arrays of model.weights.h5, "config": config.json,
    "metadata": metadata.json without its date_saved, "other": the other members' bytes by name}."""
    budget = Budget(where)
    members = zip_members(data, where, budget)
    parts: dict = {"weights": {}, "config": None, "metadata": None, "other": {}}
    for name, blob in members.items():
        if name == "model.weights.h5":
            parts["weights"] = read_hdf5(blob, f"{where}: model.weights.h5", budget)
        elif name in ("config.json", "metadata.json"):
            value = parse_json(blob, f"{where}: {name}", CheckpointError)
            if name == "metadata.json" and isinstance(value, dict):
                value = {k: v for k, v in value.items() if k not in KERAS_VOLATILE}
            parts[name[:-5]] = value
        else:
            parts["other"][name] = blob
    if "model.weights.h5" not in members:
        raise CheckpointError(f"{where}: a zip without model.weights.h5 (not a Keras 3 .keras file)")
    return parts


class PlainValue(np.ndarray):
    """Text, bytes or None read from a checkpoint, as the bytes of its repr: an array only to be compared,
    no tensor (a difference counts it apart: results.wording.first_and_count)."""

    plain_value = True


def flatten(value, where: str, prefix: str = "") -> dict[str, np.ndarray]:
    """Plain data as dotted names -> arrays: arrays as they are, numbers as 0-d arrays, anything else
    (text, bytes, None, an integer past 64 bits) as the bytes of its repr; at most MAX_VALUES names."""
    flat: dict[str, np.ndarray] = {}
    stack, visited = [(prefix, value)], 0
    while stack:
        name, item = stack.pop()
        visited += 1
        if visited > 2 * MAX_VALUES:
            raise CheckpointError(f"{where}: more than {MAX_VALUES} values")
        if isinstance(item, dict | list | tuple):
            pairs = list(item.items() if isinstance(item, dict) else enumerate(item))
            if len(stack) + len(pairs) > 2 * MAX_VALUES:
                raise CheckpointError(f"{where}: more than {MAX_VALUES} values")
            stack.extend((f"{name}.{key}" if name else str(key), inner) for key, inner in reversed(pairs))
            continue
        if isinstance(item, np.ndarray):
            flat[name or "tensor"] = item
        elif isinstance(item, bool | float) or (isinstance(item, int) and -(2**63) <= item < 2**63):
            flat[name or "value"] = np.asarray(item)
        else:
            text = np.frombuffer(repr(item).encode("utf-8", "backslashreplace"), np.uint8)
            flat[name or "value"] = text.view(PlainValue)
        if len(flat) > MAX_VALUES:
            raise CheckpointError(f"{where}: more than {MAX_VALUES} values")
    return flat
