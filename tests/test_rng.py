import random

import numpy as np

from reprocube.rng import capture_host_rng, restore_host_rng, seed_host_rng


def test_host_rng_round_trip_without_pickle():
    seed_host_rng(3)
    random.random(), random.gauss(0, 1), np.random.random(), np.random.standard_normal()  # both cache a gaussian
    assert random.getstate()[2] is not None
    arrays, meta = capture_host_rng()
    assert all(isinstance(a, np.ndarray) for a in arrays.values())
    expected = (random.random(), random.gauss(0, 1), np.random.random(3).tolist(), np.random.standard_normal())
    seed_host_rng(99)  # scramble
    restore_host_rng(arrays, meta)
    assert (random.random(), random.gauss(0, 1), np.random.random(3).tolist(), np.random.standard_normal()) == expected
