"""`torch.save` files (the zip format) read by reprocube's own restricted unpickler: nothing a pickle names is
imported or run. Every global it may name is a stand-in of ours that builds plain data (tensors rebuilt from
the archive's storages, every size, offset and stride checked against them; NumPy arrays, dtypes,
OrderedDicts, sets, torch.Size, argparse.Namespace); any other is refused, named. torch is never imported.

read_torch gives dotted names -> arrays (what outputs and tensors compare), torch_storage_dtypes the storages
a moved-weights restart moves; formats.torch_structure digests the whole unpickled graph (types and keys
included), what tells a layout difference from a real one."""

from __future__ import annotations

import io
import pickle
import re
import struct
import zipfile

import numpy as np

from reprocube.errors import CheckpointError
from reprocube.formats.tensor_readers import (
    MAX_HEADER_BYTES,
    MAX_NESTING,
    ZIP_ERRORS,
    ZIP_METHODS,
    Budget,
    element_count,
    flatten,
    safetensors_dtypes,
    short,
)
from reprocube.terminal import one_line


# --- torch.save ---------------------------------------------------------------------------------------
def read_torch(data: bytes, where: str) -> dict[str, np.ndarray]:
    """A `torch.save` file (the zip format) as dotted names -> arrays: tensors, NumPy arrays, numbers and
    the other plain values it holds (a text or None as its repr's bytes)."""
    value, _ = unpickled_torch(data, where)
    return flatten(plain(value, where), where)


def torch_storage_dtypes(data: bytes, where: str) -> dict[str, np.dtype]:
    """A `torch.save` file's storages: zip member name ("<prefix>data/<key>") -> the dtype its tensors
    read it as (the restricted unpickler's, read_torch's): what check's moved-weights restart moves."""
    _, unpickler = unpickled_torch(data, where)
    return {f"{unpickler.prefix}data/{key}": stored.array.dtype for key, stored in unpickler.storages.items()}


def unpickled_torch(data: bytes, where: str):
    if not data.startswith(b"PK"):
        raise CheckpointError(
            f"{where}: not a zip-format torch.save file (the legacy format, a TorchScript archive or another "
            "pickle is not read: save with torch.save's default format)"
        )
    budget = Budget(where)
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except ZIP_ERRORS as exc:
        raise CheckpointError(f"{where}: not a zip archive ({short(str(exc))})") from None
    with archive:
        pickles = [i for i in archive.infolist() if re.fullmatch(r"[^/]+/data\.pkl", i.filename)]
        if len(pickles) != 1:
            raise CheckpointError(f"{where}: {len(pickles)} data.pkl records (a torch.save zip has one)")
        prefix = pickles[0].filename[: -len("data.pkl")]
        if pickles[0].file_size > MAX_HEADER_BYTES:
            raise CheckpointError(f"{where}: data.pkl is {pickles[0].file_size} bytes (at most {MAX_HEADER_BYTES})")
        byteorder = _member(archive, prefix + "byteorder", where, budget, optional=True)
        if byteorder not in (None, b"little"):
            raise CheckpointError(f"{where}: byteorder {short(byteorder)} (only little-endian files are read)")
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
                f"{where}: data.pkl cannot be read ({type(exc).__name__}: {short(str(exc))})"
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
        raise CheckpointError(f"{where}: {one_line(name)} cannot be read ({short(str(exc))})") from None
    if len(blob) != info.file_size:
        raise CheckpointError(f"{where}: {one_line(name)} holds {len(blob)} bytes, not the {info.file_size} declared")
    return blob


class InertGlobal:
    """A global a pickle named, as our own stand-in: creating or calling it (NEWOBJ, REDUCE) runs only
    the stand-in's code, which builds plain data; BUILD gives it only data."""

    global_name = "?"

    def __setstate__(self, state) -> None:
        raise CheckpointError(f"state given to {self.global_name}, which takes none")


class ArrayRecord(InertGlobal):
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


class DTypeRecord(InertGlobal):
    global_name = "numpy.dtype"

    def __init__(self, dtype: np.dtype):
        self.dtype = dtype

    def __setstate__(self, state) -> None:  # (version, byteorder, subarray, names, fields, ...)
        if not (isinstance(state, tuple) and len(state) >= 5 and state[2] is None and state[3] is None):
            raise CheckpointError("a structured or subarray dtype is not read")
        if state[1] in (">", "<"):
            self.dtype = self.dtype.newbyteorder(state[1])
        elif state[1] not in ("|", "="):
            raise CheckpointError(f"a dtype byte order {short(state[1])}")


_DTYPE_TEXT = re.compile(r"[<>|=]?(b1|bool|[iu][1248]|f[248]|c(8|16)|[SU]\d{1,6})\Z")


def _dtype_of(value) -> np.dtype:
    if isinstance(value, DTypeRecord):
        return value.dtype
    if isinstance(value, StorageData):
        return value.array.dtype
    raise CheckpointError(f"{short(value)} is not a dtype")


def _array(raw, dtype, shape, fortran: bool, what: str) -> np.ndarray:
    dtype = _dtype_of(dtype)
    if not isinstance(raw, bytes | bytearray):
        raise CheckpointError(f"{what}'s data is not bytes")
    count = element_count(shape, what)
    if count * dtype.itemsize != len(raw):
        raise CheckpointError(
            f"{what} declares {short(shape)} {dtype}, {count * dtype.itemsize} bytes; it holds {len(raw)}"
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


class StorageData:
    """A torch storage read from the archive: a flat array of its dtype."""

    def __init__(self, array: np.ndarray):
        self.array = array


class NamespaceRecord(InertGlobal):
    global_name = "argparse.Namespace"

    def __setstate__(self, state) -> None:
        if not isinstance(state, dict):
            raise CheckpointError("an argparse.Namespace's state is not a mapping")
        self.fields = getattr(self, "fields", {})
        self.fields.update(state)


def _stand_ins(unpickler: _Unpickler) -> dict[tuple[str, str], type]:
    """(module, name) -> the stand-in returned for it."""

    class OrderedDict(InertGlobal):
        def __new__(cls, items=()):
            return _Mapping(items)

    class Encode(InertGlobal):  # protocol 2 writes bytes as _codecs.encode(text, "latin1")
        def __new__(cls, text, encoding="latin1"):
            if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
                raise CheckpointError("_codecs.encode of something other than latin-1 text")
            return text.encode("latin-1")

    class DType(InertGlobal):
        def __new__(cls, spec, align=False, copy=True):
            if not (isinstance(spec, str) and _DTYPE_TEXT.match(spec)):
                raise CheckpointError(f"a dtype {short(spec)} (numbers and fixed strings only)")
            return DTypeRecord(np.dtype(spec))

    class NDArray(InertGlobal):
        def __new__(cls, *args):
            raise CheckpointError("numpy.ndarray called directly")

    class Reconstruct(InertGlobal):
        def __new__(cls, subtype=None, shape=None, typecode=None):
            if subtype is not NDArray:
                raise CheckpointError("_reconstruct of something other than numpy.ndarray")
            return ArrayRecord()

    class Scalar(InertGlobal):
        def __new__(cls, dtype, raw=b""):
            scalar = _array(raw, dtype, (), False, "a NumPy scalar")
            unpickler.scalars[id(scalar)] = scalar  # told apart from a 0-d array (torch_structure); held
            return scalar

    class FromBuffer(InertGlobal):
        def __new__(cls, buffer, dtype, shape, order="C"):
            return _array(buffer, dtype, shape, order == "F", "an ndarray")

    class Size(InertGlobal):
        def __new__(cls, dims=()):
            return _SizeItems(dims)

    class Set(InertGlobal):
        def __new__(cls, items=()):
            return _SetItems(items)

    class RebuildTensor(InertGlobal):
        def __new__(cls, storage, offset, size, stride, *rest):
            tensor = _tensor(storage, offset, size, stride, unpickler.budget)
            unpickler.tensors[id(tensor)] = (tensor, storage, offset, size, stride, rest)  # held: its id is not reused
            return tensor

    class RebuildParameter(InertGlobal):
        def __new__(cls, data, *rest):
            unpickler.parameters[id(data)] = (data, *rest)  # (requires_grad, backward_hooks), the tensor held
            return data

    class Namespace(NamespaceRecord):
        def __new__(cls, *args, **kwargs):  # NEWOBJ, then BUILD with its attributes
            namespace = NamespaceRecord.__new__(NamespaceRecord)
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
        table[("torch", name)] = type(name, (InertGlobal,), {"dtype": dtype})
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
    dtypes["BFloat16Storage"] = safetensors_dtypes()["BF16"]
    return dtypes


_STORAGES = _storage_dtypes()


def _tensor(storage, offset, size, stride, budget: Budget) -> np.ndarray:
    """A tensor as torch rebuilds it (a strided view of a storage), with every index checked to lie in
    the storage, then copied out contiguous: a copy (of an expanded, stride-0 or transposed view, which
    may be far larger than its storage) charged to the file's `budget` before it is made."""
    if not isinstance(storage, StorageData):
        raise CheckpointError("a tensor rebuilt from something other than a storage")
    flat = storage.array
    count = element_count(size, "a tensor")
    element_count(stride, "a tensor's strides")
    if len(size) != len(stride) or not (isinstance(offset, int) and not isinstance(offset, bool) and offset >= 0):
        raise CheckpointError(f"a tensor's size {short(size)}, stride {short(stride)}, offset {short(offset)}")
    if count == 0:
        return np.zeros(size, flat.dtype)
    last = offset + sum((n - 1) * s for n, s in zip(size, stride, strict=True))
    if last >= flat.size:
        raise CheckpointError(f"a tensor {short(size)} at offset {offset} reaches past its storage of {flat.size}")
    view = np.lib.stride_tricks.as_strided(
        flat[offset:], shape=tuple(size), strides=tuple(s * flat.itemsize for s in stride), writeable=False
    )
    if not view.flags.c_contiguous:  # a copy: charged first (a view of its own storage's bytes is not)
        budget.charge(count * flat.itemsize, f"a tensor {short(size)} with strides {short(stride)}")
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
        self.scalars: dict[int, np.ndarray] = {}

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
            raise CheckpointError(f"{self.where}: a persistent id {short(pid)} (a torch storage was expected)")
        _, kind, key, _location, numel = pid
        dtype = getattr(kind, "dtype", None)
        if not (isinstance(kind, type) and issubclass(kind, InertGlobal) and isinstance(dtype, np.dtype)):
            raise CheckpointError(f"{self.where}: a storage of type {short(kind)}")
        if not (isinstance(key, str) and re.fullmatch(r"\d{1,20}", key)):
            raise CheckpointError(f"{self.where}: a storage key {short(key)}")
        if not (isinstance(numel, int) and not isinstance(numel, bool) and numel >= 0):
            raise CheckpointError(f"{self.where}: a storage of {short(numel)} elements")
        if key not in self.storages:
            name = f"{self.prefix}data/{key}"
            info = self.archive.getinfo(name) if name in self.archive.namelist() else None
            if info is None or info.file_size != numel * dtype.itemsize:
                held = "is missing" if info is None else f"holds {info.file_size} bytes"
                raise CheckpointError(f"{self.where}: storage {key} of {numel} x {dtype} {held}")
            blob = _member(self.archive, name, self.where, self.budget)
            self.storages[key] = StorageData(np.frombuffer(blob, dtype=dtype, count=numel))
        stored = self.storages[key]
        if stored.array.dtype != dtype:
            return StorageData(stored.array.view(dtype)) if stored.array.nbytes % dtype.itemsize == 0 else stored
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
        if isinstance(item, ArrayRecord):
            if item.array is None:
                raise CheckpointError(f"{where}: an ndarray without its data")
            result = item.array
        elif isinstance(item, StorageData):
            result = item.array
        elif isinstance(item, DTypeRecord):
            result = str(item.dtype)
        elif isinstance(item, NamespaceRecord):
            result = {k: convert(v, depth + 1) for k, v in item.fields.items()}
        elif isinstance(item, dict):
            result = {k: convert(v, depth + 1) for k, v in item.items()}
            if getattr(item, "state", None) is not None:
                result["__state__"] = convert(item.state, depth + 1)
        elif isinstance(item, list | tuple):
            result = type(item)(convert(v, depth + 1) for v in item)
        elif isinstance(item, type) and issubclass(item, InertGlobal):
            result = f"<{item.global_name}>"
        else:
            raise CheckpointError(f"{where}: a value of type {type(item).__name__} is not read")
        done[id(item)] = result
        return result

    return convert(value, 0)
