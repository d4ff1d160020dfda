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

import hashlib
import io
import math
import pickle
import re
import struct
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
        raise CheckpointError(f"{where}: the shape {_short(shape)} is not a list of at most {MAX_DIMS} sizes")
    if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape):
        raise CheckpointError(f"{where}: the shape {_short(shape)} is not a list of sizes >= 0")
    return math.prod(shape)


def _short(value) -> str:
    text = one_line(repr(value))
    return text if len(text) <= 60 else text[:57] + "..."


def _numeric(dtype: np.dtype, where: str) -> np.dtype:
    if dtype.hasobject or dtype.kind not in "biufcSU" or dtype.itemsize == 0:
        raise CheckpointError(f"{where}: the dtype {_short(str(dtype))} is not read (numbers and fixed strings only)")
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
        raise CheckpointError(f"{where}: not a NumPy .npy header ({_short(str(exc))})") from None
    dtype = _numeric(dtype, where)
    count = element_count(shape, where)
    offset = stream.tell()
    if count * dtype.itemsize != len(data) - offset:
        raise CheckpointError(
            f"{where}: the header declares {_short(shape)} {dtype} ({count * dtype.itemsize} bytes); "
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
        raise CheckpointError(f"{where}: not a zip archive ({_short(str(exc))})") from None
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
                raise CheckpointError(f"{where}: {name} cannot be read ({_short(str(exc))})") from None
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
def _safetensors_dtypes() -> dict[str, np.dtype]:
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
    body, dtypes, arrays = 8 + length, _safetensors_dtypes(), {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        place = f"{where}: tensor {one_line(name)}"
        if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
            raise CheckpointError(f"{place}: not {{dtype, shape, data_offsets}}")
        dtype = dtypes.get(entry["dtype"]) if isinstance(entry["dtype"], str) else None
        if dtype is None:
            raise CheckpointError(f"{place}: the dtype {_short(entry['dtype'])} is not read")
        count = element_count(entry["shape"], place)
        offsets = entry["data_offsets"]
        if not (
            isinstance(offsets, list)
            and len(offsets) == 2
            and all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
            and 0 <= offsets[0] <= offsets[1] <= len(data) - body
        ):
            raise CheckpointError(f"{place}: data_offsets {_short(offsets)} outside the {len(data) - body} data bytes")
        if offsets[1] - offsets[0] != count * dtype.itemsize:
            raise CheckpointError(
                f"{place}: {_short(entry['shape'])} {entry['dtype']} is {count * dtype.itemsize} bytes, "
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
        raise CheckpointError(f"{where}: not a readable HDF5 file ({_short(str(exc))})") from None
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


# --- torch.save ---------------------------------------------------------------------------------------
def read_torch(data: bytes, where: str) -> dict[str, np.ndarray]:
    """A `torch.save` file (the zip format) as dotted names -> arrays: tensors, NumPy arrays, numbers and
    the other plain values it holds (a text or None as its repr's bytes)."""
    value, _ = _unpickled_torch(data, where)
    return flatten(plain(value, where), where)


def torch_storage_dtypes(data: bytes, where: str) -> dict[str, np.dtype]:
    """A `torch.save` file's storages: zip member name ("<prefix>data/<key>") -> the dtype its tensors
    read it as (the restricted unpickler's, read_torch's): what check's moved-weights restart moves."""
    _, unpickler = _unpickled_torch(data, where)
    return {f"{unpickler.prefix}data/{key}": stored.array.dtype for key, stored in unpickler.storages.items()}


def torch_structure(data: bytes, where: str) -> str:
    """A digest of everything a `torch.save` file holds as torch would load it: each value with its type (a
    tensor, a Parameter and its arguments, a NumPy array, a set, a torch.Size, a dict or an OrderedDict and
    its attributes, a list, a tuple, text or bytes), every key as the type it is, in order; a tensor's dtype,
    size, stride, offset and which storage it shares. Not pickle's memo or framing, nor the archive's member
    order: two files of one digest differ only in how their bytes are laid out."""
    value, unpickler = _unpickled_torch(data, where)
    digest, storages, visits = hashlib.sha256(), {}, [0]

    def put(tag: str, payload: bytes = b"") -> None:
        digest.update(tag.encode() + len(payload).to_bytes(8, "little") + payload)

    def walk(item, depth: int) -> None:
        visits[0] += 1
        if depth > MAX_NESTING or visits[0] > 2 * MAX_VALUES:
            raise CheckpointError(f"{where}: nested more than {MAX_NESTING} deep or more than {MAX_VALUES} values")
        if item is None or isinstance(item, bool | int | float | complex | str | bytes | bytearray):
            put(type(item).__name__, _scalar_bytes(item))
        elif isinstance(item, np.ndarray):
            rebuilt = unpickler.tensors.get(id(item))
            if rebuilt is None:
                put("ndarray", f"{item.dtype.str}{item.shape}".encode())
            else:
                storage, offset, size, stride, rest = rebuilt
                index = storages.setdefault(id(storage), len(storages))
                put("tensor", repr((item.dtype.str, index, offset, tuple(size), tuple(stride))).encode())
                walk(rest, depth + 1)
                walk(unpickler.parameters.get(id(item)), depth + 1)  # None: no Parameter
            put("data", item.tobytes())
        elif isinstance(item, _ArrayRecord | _StorageData):
            walk(item.array, depth + 1)
        elif isinstance(item, _DTypeRecord):
            put("dtype", item.dtype.str.encode())
        elif isinstance(item, _Namespace):
            put("namespace")
            walk(dict(item.fields), depth + 1)
        elif isinstance(item, dict):
            put(type(item).__name__, str(len(item)).encode())
            for key, inner in item.items():
                walk(key, depth + 1)
                walk(inner, depth + 1)
            walk(getattr(item, "state", None), depth + 1)
        elif isinstance(item, list | tuple):
            put(type(item).__name__, str(len(item)).encode())
            for inner in item:
                walk(inner, depth + 1)
        elif isinstance(item, type) and issubclass(item, _Inert):
            put("global", item.global_name.encode())
        else:
            raise CheckpointError(f"{where}: a value of type {type(item).__name__} is not read")

    walk(value, 0)
    return digest.hexdigest()


def _scalar_bytes(item) -> bytes:
    if isinstance(item, float):
        return struct.pack("<d", item)  # its bits: -0.0 and a NaN's payload are kept
    if isinstance(item, complex):
        return struct.pack("<dd", item.real, item.imag)
    if isinstance(item, str):
        return item.encode("utf-8", "surrogatepass")
    return bytes(item) if isinstance(item, bytes | bytearray) else repr(item).encode()


def _unpickled_torch(data: bytes, where: str):
    if not data.startswith(b"PK"):
        raise CheckpointError(
            f"{where}: not a zip-format torch.save file (the legacy format, a TorchScript archive or another "
            "pickle is not read: save with torch.save's default format)"
        )
    budget = Budget(where)
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except ZIP_ERRORS as exc:
        raise CheckpointError(f"{where}: not a zip archive ({_short(str(exc))})") from None
    with archive:
        pickles = [i for i in archive.infolist() if re.fullmatch(r"[^/]+/data\.pkl", i.filename)]
        if len(pickles) != 1:
            raise CheckpointError(f"{where}: {len(pickles)} data.pkl records (a torch.save zip has one)")
        prefix = pickles[0].filename[: -len("data.pkl")]
        if pickles[0].file_size > MAX_HEADER_BYTES:
            raise CheckpointError(f"{where}: data.pkl is {pickles[0].file_size} bytes (at most {MAX_HEADER_BYTES})")
        byteorder = _member(archive, prefix + "byteorder", where, budget, optional=True)
        if byteorder not in (None, b"little"):
            raise CheckpointError(f"{where}: byteorder {_short(byteorder)} (only little-endian files are read)")
        pkl = _member(archive, pickles[0].filename, where, budget)
        unpickler = _Unpickler(io.BytesIO(pkl), archive, prefix, where, budget)
        try:
            value = unpickler.load()
        except CheckpointError:
            raise
        except (
            pickle.UnpicklingError,
            ValueError,
            TypeError,
            KeyError,
            IndexError,
            EOFError,
            AttributeError,
            RecursionError,
            MemoryError,
            OverflowError,
            struct.error,
        ) as exc:
            raise CheckpointError(
                f"{where}: data.pkl cannot be read ({type(exc).__name__}: {_short(str(exc))})"
            ) from None
    return value, unpickler


def _member(archive, name: str, where: str, budget: Budget, optional: bool = False) -> bytes | None:
    try:
        info = archive.getinfo(name)
    except KeyError:
        if optional:
            return None
        raise CheckpointError(f"{where}: {one_line(name)} is missing") from None
    if info.compress_type not in ZIP_METHODS:
        raise CheckpointError(f"{where}: {one_line(name)} is compressed with method {info.compress_type} (not read)")
    budget.charge(info.file_size, one_line(name))
    try:
        with archive.open(info) as member:
            blob = member.read(info.file_size + 1)
    except ZIP_ERRORS as exc:
        raise CheckpointError(f"{where}: {one_line(name)} cannot be read ({_short(str(exc))})") from None
    if len(blob) != info.file_size:
        raise CheckpointError(f"{where}: {one_line(name)} holds {len(blob)} bytes, not the {info.file_size} declared")
    return blob


class _Inert:
    """A global a pickle named, as our own stand-in: creating or calling it (NEWOBJ, REDUCE) runs only
    the stand-in's code, which builds plain data; BUILD gives it only data."""

    global_name = "?"

    def __setstate__(self, state) -> None:
        raise CheckpointError(f"state given to {self.global_name}, which takes none")


class _ArrayRecord(_Inert):
    """numpy's _reconstruct(ndarray, (0,), b'b') followed by BUILD (version, shape, dtype, fortran, bytes)."""

    global_name = "numpy.ndarray"
    array = None

    def __setstate__(self, state) -> None:
        if isinstance(state, tuple) and len(state) == 5:
            state = state[1:]
        if not (isinstance(state, tuple) and len(state) == 4):
            raise CheckpointError("an ndarray's state is not (shape, dtype, fortran, bytes)")
        shape, dtype, fortran, raw = state
        self.array = _array(raw, dtype, shape, bool(fortran), "an ndarray")


class _DTypeRecord(_Inert):
    global_name = "numpy.dtype"

    def __init__(self, dtype: np.dtype):
        self.dtype = dtype

    def __setstate__(self, state) -> None:  # (version, byteorder, subarray, names, fields, ...)
        if not (isinstance(state, tuple) and len(state) >= 5 and state[2] is None and state[3] is None):
            raise CheckpointError("a structured or subarray dtype is not read")
        if state[1] in (">", "<"):
            self.dtype = self.dtype.newbyteorder(state[1])
        elif state[1] not in ("|", "="):
            raise CheckpointError(f"a dtype byte order {_short(state[1])}")


_DTYPE_TEXT = re.compile(r"[<>|=]?(b1|bool|[iu][1248]|f[248]|c(8|16)|[SU]\d{1,6})\Z")


def _dtype_of(value) -> np.dtype:
    if isinstance(value, _DTypeRecord):
        return value.dtype
    if isinstance(value, _StorageData):
        return value.array.dtype
    raise CheckpointError(f"{_short(value)} is not a dtype")


def _array(raw, dtype, shape, fortran: bool, what: str) -> np.ndarray:
    dtype = _dtype_of(dtype)
    if not isinstance(raw, bytes | bytearray):
        raise CheckpointError(f"{what}'s data is not bytes")
    count = element_count(shape, what)
    if count * dtype.itemsize != len(raw):
        raise CheckpointError(
            f"{what} declares {_short(shape)} {dtype}, {count * dtype.itemsize} bytes; it holds {len(raw)}"
        )
    return np.frombuffer(bytes(raw), dtype=dtype, count=count).reshape(shape, order="F" if fortran else "C")


class _Mapping(dict):
    """An OrderedDict as a dict, with the attributes BUILD gives it (a state dict's `_metadata`),
    compared under the name `__state__`."""

    state = None

    def __setstate__(self, state) -> None:
        if not isinstance(state, dict):
            raise CheckpointError("an OrderedDict's state is not a mapping")
        self.state = state


class _SetItems(tuple):
    """A set or frozenset's items, told apart from a tuple (torch_structure)."""


class _SizeItems(tuple):
    """A torch.Size's dimensions, told apart from a tuple (torch_structure)."""


class _StorageData:
    """A torch storage read from the archive: a flat array of its dtype."""

    def __init__(self, array: np.ndarray):
        self.array = array


class _Namespace(_Inert):
    global_name = "argparse.Namespace"

    def __setstate__(self, state) -> None:
        if not isinstance(state, dict):
            raise CheckpointError("an argparse.Namespace's state is not a mapping")
        self.fields = getattr(self, "fields", {})
        self.fields.update(state)


def _stand_ins(unpickler: _Unpickler) -> dict[tuple[str, str], type]:
    """(module, name) -> the stand-in returned for it."""

    class OrderedDict(_Inert):
        def __new__(cls, items=()):
            return _Mapping(items)

    class Encode(_Inert):  # protocol 2 writes bytes as _codecs.encode(text, "latin1")
        def __new__(cls, text, encoding="latin1"):
            if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
                raise CheckpointError("_codecs.encode of something other than latin-1 text")
            return text.encode("latin-1")

    class DType(_Inert):
        def __new__(cls, spec, align=False, copy=True):
            if not (isinstance(spec, str) and _DTYPE_TEXT.match(spec)):
                raise CheckpointError(f"a dtype {_short(spec)} (numbers and fixed strings only)")
            return _DTypeRecord(np.dtype(spec))

    class NDArray(_Inert):
        def __new__(cls, *args):
            raise CheckpointError("numpy.ndarray called directly")

    class Reconstruct(_Inert):
        def __new__(cls, subtype=None, shape=None, typecode=None):
            if subtype is not NDArray:
                raise CheckpointError("_reconstruct of something other than numpy.ndarray")
            return _ArrayRecord()

    class Scalar(_Inert):
        def __new__(cls, dtype, raw=b""):
            return _array(raw, dtype, (), False, "a NumPy scalar")

    class FromBuffer(_Inert):
        def __new__(cls, buffer, dtype, shape, order="C"):
            return _array(buffer, dtype, shape, order == "F", "an ndarray")

    class Size(_Inert):
        def __new__(cls, dims=()):
            return _SizeItems(dims)

    class Set(_Inert):
        def __new__(cls, items=()):
            return _SetItems(items)

    class RebuildTensor(_Inert):
        def __new__(cls, storage, offset, size, stride, *rest):
            tensor = _tensor(storage, offset, size, stride, unpickler.budget)
            unpickler.tensors[id(tensor)] = (storage, offset, size, stride, rest)
            return tensor

    class RebuildParameter(_Inert):
        def __new__(cls, data, *rest):
            unpickler.parameters[id(data)] = rest  # (requires_grad, backward_hooks)
            return data

    class Namespace(_Namespace):
        def __new__(cls, *args, **kwargs):  # NEWOBJ, then BUILD with its attributes
            namespace = _Namespace.__new__(_Namespace)
            namespace.fields = dict(kwargs)
            return namespace

    table: dict[tuple[str, str], type] = {
        ("collections", "OrderedDict"): OrderedDict,
        ("_codecs", "encode"): Encode,
        ("numpy", "dtype"): DType,
        ("numpy", "ndarray"): NDArray,
        ("torch", "Size"): Size,
        ("builtins", "set"): Set,
        ("builtins", "frozenset"): Set,
        ("__builtin__", "set"): Set,  # protocol 2 (torch.save's) names builtins so
        ("__builtin__", "frozenset"): Set,
        ("argparse", "Namespace"): Namespace,
        ("torch._utils", "_rebuild_tensor_v2"): RebuildTensor,
        ("torch._utils", "_rebuild_parameter"): RebuildParameter,
    }
    for module in ("numpy.core.multiarray", "numpy._core.multiarray"):
        table[(module, "_reconstruct")] = Reconstruct
        table[(module, "scalar")] = Scalar
    for module in ("numpy.core.numeric", "numpy._core.numeric"):
        table[(module, "_frombuffer")] = FromBuffer
    for name, dtype in _STORAGES.items():
        table[("torch", name)] = type(name, (_Inert,), {"dtype": dtype})
    for (module, name), stand_in in table.items():
        stand_in.global_name = f"{module}.{name}"
    return table


def _storage_dtypes() -> dict[str, np.dtype]:
    names = {
        "FloatStorage": "<f4",
        "DoubleStorage": "<f8",
        "HalfStorage": "<f2",
        "LongStorage": "<i8",
        "IntStorage": "<i4",
        "ShortStorage": "<i2",
        "CharStorage": "i1",
        "ByteStorage": "u1",
        "BoolStorage": "?",
        "ComplexFloatStorage": "<c8",
        "ComplexDoubleStorage": "<c16",
        "UInt16Storage": "<u2",
        "UInt32Storage": "<u4",
        "UInt64Storage": "<u8",
    }
    dtypes = {name: np.dtype(code) for name, code in names.items()}
    dtypes["BFloat16Storage"] = _safetensors_dtypes()["BF16"]
    return dtypes


_STORAGES = _storage_dtypes()


def _tensor(storage, offset, size, stride, budget: Budget) -> np.ndarray:
    """A tensor as torch rebuilds it (a strided view of a storage), with every index checked to lie in
    the storage, then copied out contiguous: a copy (of an expanded, stride-0 or transposed view, which
    may be far larger than its storage) charged to the file's `budget` before it is made."""
    if not isinstance(storage, _StorageData):
        raise CheckpointError("a tensor rebuilt from something other than a storage")
    flat = storage.array
    count = element_count(size, "a tensor")
    element_count(stride, "a tensor's strides")
    if len(size) != len(stride) or not (isinstance(offset, int) and not isinstance(offset, bool) and offset >= 0):
        raise CheckpointError(f"a tensor's size {_short(size)}, stride {_short(stride)}, offset {_short(offset)}")
    if count == 0:
        return np.zeros(size, flat.dtype)
    last = offset + sum((n - 1) * s for n, s in zip(size, stride, strict=True))
    if last >= flat.size:
        raise CheckpointError(f"a tensor {_short(size)} at offset {offset} reaches past its storage of {flat.size}")
    view = np.lib.stride_tricks.as_strided(
        flat[offset:], shape=tuple(size), strides=tuple(s * flat.itemsize for s in stride), writeable=False
    )
    if not view.flags.c_contiguous:  # a copy: charged first (a view of its own storage's bytes is not)
        budget.charge(count * flat.itemsize, f"a tensor {_short(size)} with strides {_short(stride)}")
    return np.ascontiguousarray(view)


class _Unpickler(pickle.Unpickler):
    def __init__(self, stream, archive, prefix: str, where: str, budget: Budget):
        super().__init__(stream)
        self.archive, self.prefix, self.where, self.budget = archive, prefix, where, budget
        self.table, self.storages = _stand_ins(self), {}
        # what torch_structure tells apart and the plain values do not: id(array) -> (storage, offset, size,
        # stride, the rest of its rebuild's arguments); id(array) -> a Parameter's (requires_grad, hooks)
        self.tensors: dict[int, tuple] = {}
        self.parameters: dict[int, tuple] = {}

    def find_class(self, module: str, name: str):
        stand_in = self.table.get((module, name))
        if stand_in is None:
            raise CheckpointError(
                f"{self.where}: the pickle names {one_line(str(module))}.{one_line(str(name))}, which is not read "
                "(only tensors, NumPy arrays and plain values are; nothing a pickle names is run)"
            )
        return stand_in

    def persistent_load(self, pid):
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
            raise CheckpointError(f"{self.where}: a persistent id {_short(pid)} (a torch storage was expected)")
        _, kind, key, _location, numel = pid
        dtype = getattr(kind, "dtype", None)
        if not (isinstance(kind, type) and issubclass(kind, _Inert) and isinstance(dtype, np.dtype)):
            raise CheckpointError(f"{self.where}: a storage of type {_short(kind)}")
        if not (isinstance(key, str) and re.fullmatch(r"\d{1,20}", key)):
            raise CheckpointError(f"{self.where}: a storage key {_short(key)}")
        if not (isinstance(numel, int) and not isinstance(numel, bool) and numel >= 0):
            raise CheckpointError(f"{self.where}: a storage of {_short(numel)} elements")
        if key not in self.storages:
            name = f"{self.prefix}data/{key}"
            info = self.archive.getinfo(name) if name in self.archive.namelist() else None
            if info is None or info.file_size != numel * dtype.itemsize:
                held = "is missing" if info is None else f"holds {info.file_size} bytes"
                raise CheckpointError(f"{self.where}: storage {key} of {numel} x {dtype} {held}")
            blob = _member(self.archive, name, self.where, self.budget)
            self.storages[key] = _StorageData(np.frombuffer(blob, dtype=dtype, count=numel))
        stored = self.storages[key]
        if stored.array.dtype != dtype:
            return _StorageData(stored.array.view(dtype)) if stored.array.nbytes % dtype.itemsize == 0 else stored
        return stored


def plain(value, where: str):
    """The unpickled value as plain data (dicts, lists, tuples, numbers, text, bytes, arrays): each
    object converted once (a pickle may share one object many times), nesting at most MAX_NESTING."""
    done: dict[int, object] = {}

    def convert(item, depth: int):
        if depth > MAX_NESTING:
            raise CheckpointError(f"{where}: nested more than {MAX_NESTING} deep")
        if item is None or isinstance(item, bool | int | float | complex | str | bytes | np.ndarray):
            return item
        if id(item) in done:
            return done[id(item)]
        if isinstance(item, _ArrayRecord):
            if item.array is None:
                raise CheckpointError(f"{where}: an ndarray without its data")
            result = item.array
        elif isinstance(item, _StorageData):
            result = item.array
        elif isinstance(item, _DTypeRecord):
            result = str(item.dtype)
        elif isinstance(item, _Namespace):
            result = {k: convert(v, depth + 1) for k, v in item.fields.items()}
        elif isinstance(item, dict):
            result = {k: convert(v, depth + 1) for k, v in item.items()}
            if getattr(item, "state", None) is not None:
                result["__state__"] = convert(item.state, depth + 1)
        elif isinstance(item, list | tuple):
            result = type(item)(convert(v, depth + 1) for v in item)
        elif isinstance(item, type) and issubclass(item, _Inert):
            result = f"<{item.global_name}>"
        else:
            raise CheckpointError(f"{where}: a value of type {type(item).__name__} is not read")
        done[id(item)] = result
        return result

    return convert(value, 0)


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
            flat[name or "value"] = np.frombuffer(repr(item).encode("utf-8", "backslashreplace"), np.uint8)
        if len(flat) > MAX_VALUES:
            raise CheckpointError(f"{where}: more than {MAX_VALUES} values")
    return flat
