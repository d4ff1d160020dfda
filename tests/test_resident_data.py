"""The data store's normalised images start on a 64-byte boundary, and the TensorFlow trainer shares them
instead of copying them (0.4 s and the training set's size in memory, each process); memory that is not
so aligned, which would abort a TensorFlow kernel, is copied, and so is memory bound for a GPU."""

from __future__ import annotations

import numpy as np
import pytest

from reprocube.data.store import ALIGNMENT, _aligned_empty


@pytest.mark.parametrize("shape", [(1, 1, 28, 28), (7, 1, 28, 28), (60000, 1, 28, 28)])
def test_the_stores_arrays_are_aligned_and_whole(shape):
    array = _aligned_empty(shape, np.float32)
    assert array.ctypes.data % ALIGNMENT == 0
    assert array.shape == shape and array.dtype == np.float32 and array.flags["C_CONTIGUOUS"]
    array[...] = 1.5  # writable, and every element is its own
    assert float(array.sum()) == 1.5 * array.size


@pytest.mark.parametrize("limits", [[], ["data.train_limit=7", "data.test_limit=3"]])
def test_load_dataset_gives_aligned_images(generated, limits):
    from reprocube.config import load_config
    from reprocube.data.store import load_dataset

    dataset = load_dataset(load_config(["framework=tensorflow", *generated.overrides(), *limits]))
    for split in (dataset.train, dataset.test):
        assert split.images.ctypes.data % ALIGNMENT == 0 and split.images.flags["C_CONTIGUOUS"]


def test_tensorflow_shares_aligned_images_and_copies_the_others():
    from reprocube.frameworks.tensorflow import _resident

    rng = np.random.default_rng(0)
    aligned = _aligned_empty((5, 1, 28, 28), np.float32)
    aligned[...] = rng.standard_normal(aligned.shape, dtype=np.float32)
    unaligned = np.frombuffer(bytearray(aligned.nbytes + 4), np.float32, offset=4).reshape(aligned.shape)
    unaligned[...] = aligned
    assert unaligned.ctypes.data % ALIGNMENT != 0

    expected = aligned.transpose(0, 2, 3, 1).copy()
    for images, device, shared in [(aligned, "cpu", True), (unaligned, "cpu", False), (aligned, "gpu", False)]:
        tensor = _resident(images, device)
        assert tensor.shape == (5, 28, 28, 1) and tensor.numpy().tobytes() == expected.tobytes()
        assert float(tensor[1:3].numpy().sum()) == float(expected[1:3].sum())  # a kernel reads it
        before = images[0, 0, 0, 0]
        images[0, 0, 0, 0] = 1e6  # shared memory shows the change; a copy does not
        assert (float(tensor[0, 0, 0, 0]) == 1e6) is shared, (device, shared)
        images[0, 0, 0, 0] = before
