import numpy as np
import pytest

from reprocube.data.idx import parse_idx
from reprocube.errors import DataError

from helpers import encode_idx


def test_round_trip():
    images = np.arange(2 * 28 * 28, dtype=np.uint64).astype(np.uint8).reshape(2, 28, 28)
    parsed = parse_idx(encode_idx(images))
    assert parsed.shape == (2, 28, 28)
    assert np.array_equal(parsed, images)


def test_labels_round_trip():
    labels = np.array([3, 1, 4, 1, 5], dtype=np.uint8)
    assert np.array_equal(parse_idx(encode_idx(labels)), labels)


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda b: b[:-1], "truncated IDX file"),
        (lambda b: b[:10], "truncated IDX file"),
        (lambda b: b[:3], "shorter than its 4-byte header"),
        (lambda b: b + b"\x00", "malformed IDX file"),
        (lambda b: b"\x01" + b[1:], "bad magic number"),
        (lambda b: b[:2] + b"\x0d" + b[3:], "unsupported IDX element type 0x0d"),
        (lambda b: b[:3] + b"\x09" + b[4:], "9 dimensions"),
    ],
)
def test_malformed_files_are_refused(mutate, message):
    good = encode_idx(np.zeros((3, 28, 28), dtype=np.uint8))
    with pytest.raises(DataError, match=message):
        parse_idx(mutate(good), "test.idx")
