"""Random augmentation whose randomness is a pure function of (seed, epoch, example index), the way Grain's
random map transforms derive a per-record generator from the seed and the index: the result does not
depend on the number of loader workers, on prefetching, or on where a run was resumed.

The augmentation: a horizontal flip with probability 1/2 and a shift of up to 2 pixels in each direction
(the vacated border filled with the background). Why these two for Fashion-MNIST: its garments are
centred and left-right symmetric, so a mirrored shirt is still a shirt (a mirrored digit is not), and a
small shift teaches the convolutions what centring hides; both keep every label valid and cost a copy.

The arithmetic is NumPy's, in the loader workers of all three frameworks: the three trainers see the same
augmented bytes. `stateful_params` is the trap most tutorials fall into (draws from the worker process's
global generator, seeded once per worker): reprocube keeps it only as the negative control of
data.augment_rng=stateful, which verify must catch."""

from __future__ import annotations

import numpy as np

MAX_SHIFT = 2
_AUGMENT_TAG = 0x41554731  # "AUG1": keeps these draws apart from every other use of the seed
_MASK64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser, vectorised: a bijection of uint64 whose outputs look independent."""
    with np.errstate(over="ignore"):
        x = (x + np.uint64(0x9E3779B97F4A7C15)) & _MASK64
        x = ((x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)) & _MASK64
        x = ((x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)) & _MASK64
        return x ^ (x >> np.uint64(31))


def stateless_params(seed: int, epoch: int, indices: np.ndarray) -> np.ndarray:
    """(n, 3) int64: flip (0/1), dy and dx in [-MAX_SHIFT, MAX_SHIFT] for each example index, a pure
    function of (seed, epoch, index)."""
    with np.errstate(over="ignore"):
        key = _splitmix64(np.uint64(seed) ^ np.uint64(_AUGMENT_TAG << 32))
        key = _splitmix64(key ^ np.uint64(epoch))
        bits = _splitmix64(key ^ np.asarray(indices, dtype=np.uint64))
    span = np.uint64(2 * MAX_SHIFT + 1)
    flip = bits & np.uint64(1)
    dy = (bits >> np.uint64(8)) % span
    dx = (bits >> np.uint64(24)) % span
    return np.stack([flip, dy, dx], axis=-1).astype(np.int64) - np.array([0, MAX_SHIFT, MAX_SHIFT])


def stateful_params(count: int) -> np.ndarray:
    """The tutorials' way (the negative control): draws from this process's global NumPy generator, which a
    loader worker seeds once when it starts and nobody saves."""
    flip = np.random.randint(0, 2, size=count)
    shifts = np.random.randint(-MAX_SHIFT, MAX_SHIFT + 1, size=(count, 2))
    return np.concatenate([flip[:, None], shifts], axis=1).astype(np.int64)


def apply(images: np.ndarray, params: np.ndarray, background: float) -> np.ndarray:
    """Flip and shift each image of a float32 (n, 1, 28, 28) batch by its row of `params`; exact copies of
    pixel values (no interpolation), so any framework gets the same bytes."""
    n, _, height, width = images.shape
    padded = np.full((n, 1, height + 2 * MAX_SHIFT, width + 2 * MAX_SHIFT), background, dtype=images.dtype)
    flipped = np.where(params[:, 0, None, None, None] == 1, images[..., ::-1], images)
    padded[:, :, MAX_SHIFT : MAX_SHIFT + height, MAX_SHIFT : MAX_SHIFT + width] = flipped
    out = np.empty_like(images)
    for i, (_, dy, dx) in enumerate(params.tolist()):
        top, left = MAX_SHIFT - dy, MAX_SHIFT - dx  # shift the content by (dy, dx)
        out[i] = padded[i, :, top : top + height, left : left + width]
    return out
