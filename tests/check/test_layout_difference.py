"""A torch.save file the same as another in every value but not in bytes is a layout difference only where
everything torch would load is the same, types, keys and nesting included (formats.torch_pickle's
torch_structure, analysis.outputs' comparison): round 10's helper passed five broken resumes whose final
file had every tensor the same and a key's type, a tensor's class or the nesting changed. Files made here by
torch itself; the truth of each pair read back with torch.load."""

from __future__ import annotations

import io

import pytest

from reprocube.analysis.output_content import content_difference
from reprocube.formats.torch_structure import torch_structure

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")


def saved(value) -> bytes:
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


def weights():
    return torch.arange(4, dtype=torch.float32)


def memo_shared() -> bytes:
    key = "weight"
    return saved({"names": [key], "state": {key: weights()}})


def memo_apart() -> bytes:
    return saved({"names": ["weight"], "state": {"".join(["wei", "ght"]): weights()}})


def test_pickles_memo_alone_is_a_layout_difference():
    a, b = memo_shared(), memo_apart()
    assert a != b  # the truth: other bytes ...
    loaded_a, loaded_b = (torch.load(io.BytesIO(x), weights_only=True) for x in (a, b))
    assert loaded_a["names"] == loaded_b["names"] and torch.equal(
        loaded_a["state"]["weight"], loaded_b["state"]["weight"]
    )
    assert torch_structure(a, "A") == torch_structure(b, "B")  # ... and the same loaded
    found = content_difference("final.pt", a, b)
    assert found.get("layout") is True and found.get("tensor") is None, found


PAIRS = {
    # round 10 (the helper's case 3): optimizer state keys 0 against "0" after a JSON round trip
    "a key's type": ({"state": {0: weights()}}, {"state": {"0": weights()}}),
    # case 4: a NumPy array saved where the tensor was
    "a tensor or an array": ({"w": weights()}, {"w": weights().numpy()}),
    # case 5: flat against nested keys that flatten to one dotted name
    "the nesting": ({"model": {"w": weights()}}, {"model.w": weights()}),
    "an empty container": ({"w": weights(), "extra": {}}, {"w": weights(), "extra": []}),
    "a set or a tuple": ({"w": weights(), "tags": {1}}, {"w": weights(), "tags": (1,)}),
    "a bare tensor": (weights(), {"tensor": weights()}),
    "a Parameter": ({"w": torch.nn.Parameter(weights())}, {"w": weights()}),
    "requires_grad": ({"w": torch.nn.Parameter(weights(), requires_grad=False)}, {"w": torch.nn.Parameter(weights())}),
    "a shared storage": (
        (lambda t: {"a": t, "b": t})(weights()),
        {"a": weights(), "b": weights()},
    ),
    "a list or a tuple": ({"w": weights(), "shape": [4]}, {"w": weights(), "shape": (4,)}),
    "an int or a bool": ({"w": weights(), "flag": 1}, {"w": weights(), "flag": True}),
    "-0.0 or 0.0": ({"w": weights(), "lr": 0.0}, {"w": weights(), "lr": -0.0}),
    # round 10's second helper: a NumPy scalar against a 0-d array (caseA)
    "a NumPy scalar": (
        {"w": weights(), "first": np.float32(0.5)},
        {"w": weights(), "first": np.array(0.5, np.float32)},
    ),
    # the bytes of a tensor's storage outside its view, which torch loads (caseB)
    "a storage beyond the view": (
        {"w": torch.arange(16, dtype=torch.float32)[:8]},
        {"w": torch.cat([torch.arange(8, dtype=torch.float32), torch.zeros(8)])[:8]},
    ),
    "one list held twice": ((lambda shared: {"a": shared, "b": shared})([1, 2]), {"a": [1, 2], "b": [1, 2]}),
    "one tensor held twice": (
        (lambda t: {"a": t, "b": t})(weights()),
        (lambda t: {"a": t[:], "b": t[:]})(weights()),
    ),
    "an array's memory order": (
        {"w": np.asfortranarray(np.arange(6, dtype=np.float32).reshape(2, 3))},
        {"w": np.ascontiguousarray(np.arange(6, dtype=np.float32).reshape(2, 3))},
    ),
}


@pytest.mark.parametrize("case", PAIRS)
def test_what_torch_would_load_differently_is_never_a_layout_difference(case):
    one, other = (saved(value) for value in PAIRS[case])
    assert one != other
    assert torch_structure(one, "A") != torch_structure(other, "B")
    found = content_difference("final.pt", one, other)
    assert not found.get("layout") and not found.get("same"), found


def test_a_structure_is_read_without_running_the_pickle(tmp_path):
    """The structure's reader is the strict one: a pickle naming anything else is refused, never run."""
    import pickle
    import zipfile

    from reprocube.errors import CheckpointError

    class Boom:
        def __reduce__(self):
            return (print, ("ran",))

    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("archive/data.pkl", pickle.dumps(Boom(), protocol=2))
    with pytest.raises(CheckpointError, match="not read"):
        torch_structure(buffer.getvalue(), "planted.pt")
