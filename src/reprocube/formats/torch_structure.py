"""What a `torch.save` file holds as torch would load it, as one digest (torch_structure): every value with
its type, every key as the type it is, in order, each tensor with its whole storage, and which mutable
values are one object held twice. Two files of one digest differ only in how their bytes are laid out
(pickle's memo of text, the archive's member order): what check counts as a layout difference."""

from __future__ import annotations

import hashlib
import struct

import numpy as np

from reprocube.errors import CheckpointError
from reprocube.formats.tensor_readers import MAX_NESTING, MAX_VALUES
from reprocube.formats.torch_pickle import (
    ArrayRecord,
    DTypeRecord,
    InertGlobal,
    NamespaceRecord,
    StorageData,
    unpickled_torch,
)


def torch_structure(data: bytes, where: str) -> str:
    """A digest of everything a `torch.save` file holds as torch would load it: each value with its type (a
    tensor, a Parameter and its arguments, a NumPy array, a set, a torch.Size, a dict or an OrderedDict and
    its attributes, a list, a tuple, text or bytes, a NumPy scalar apart from a 0-d array), every key as the
    type it is, in order; a tensor's dtype, size, stride, offset and its whole storage, bytes outside the view
    included; an array's memory order; which mutable values (lists, dicts, arrays, tensors) are one object
    held twice. Not pickle's memo of text or its framing, nor the archive's member order: two files of one
    digest differ only in how their bytes are laid out."""
    value, unpickler = unpickled_torch(data, where)
    digest, storages, objects, visits = hashlib.sha256(), {}, {}, [0]

    def put(tag: str, payload: bytes = b"") -> None:
        digest.update(tag.encode() + len(payload).to_bytes(8, "little") + payload)

    def walk(item, depth: int) -> None:
        visits[0] += 1
        if depth > MAX_NESTING or visits[0] > 2 * MAX_VALUES:
            raise CheckpointError(f"{where}: nested more than {MAX_NESTING} deep or more than {MAX_VALUES} values")
        if item is None or isinstance(item, bool | int | float | complex | str | bytes | bytearray):
            put(type(item).__name__, _scalar_bytes(item))
            return
        if isinstance(item, list | dict | np.ndarray | ArrayRecord):  # mutable: one object held twice is not two
            if id(item) in objects:
                put("same object", str(objects[id(item)]).encode())
                return
            objects[id(item)] = len(objects)
        if isinstance(item, np.ndarray):
            rebuilt = unpickler.tensors.get(id(item))
            if rebuilt is None:
                kind = "numpy scalar" if id(item) in unpickler.scalars else "ndarray"
                order = "F" if item.flags.f_contiguous and not item.flags.c_contiguous else "C"
                put(kind, f"{item.dtype.str}{item.shape}{order}".encode())
            else:
                _tensor_object, storage, offset, size, stride, rest = rebuilt
                if id(storage) not in storages:  # the whole storage, once: what lies outside the view too
                    storages[id(storage)] = len(storages)
                    put("storage", f"{storage.array.dtype.str}{storage.array.size}".encode() + storage.array.tobytes())
                index = storages[id(storage)]
                put("tensor", repr((item.dtype.str, index, offset, tuple(size), tuple(stride))).encode())
                walk(rest, depth + 1)
                walk(unpickler.parameters.get(id(item), (None,))[1:] or None, depth + 1)  # None: no Parameter
            put("data", item.tobytes())
        if isinstance(item, np.ndarray):
            return
        if isinstance(item, ArrayRecord | StorageData):
            walk(item.array, depth + 1)
        elif isinstance(item, DTypeRecord):
            put("dtype", item.dtype.str.encode())
        elif isinstance(item, NamespaceRecord):
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
        elif isinstance(item, type) and issubclass(item, InertGlobal):
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
