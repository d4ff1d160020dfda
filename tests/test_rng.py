import random

import numpy as np

from reprocube.training.rng import HostRng, seed_host_rng


def test_host_rng_round_trip_without_pickle():
    seed_host_rng(3)
    random.random(), random.gauss(0, 1), np.random.random(), np.random.standard_normal()  # both cache a gaussian
    assert random.getstate()[2] is not None
    captured = HostRng.capture()
    assert all(isinstance(a, np.ndarray) for a in captured.arrays.values())
    expected = (random.random(), random.gauss(0, 1), np.random.random(3).tolist(), np.random.standard_normal())
    seed_host_rng(99)  # scramble
    captured.restore()
    assert (random.random(), random.gauss(0, 1), np.random.random(3).tolist(), np.random.standard_normal()) == expected


def test_split_separates_the_host_generators_from_the_frameworks():
    arrays = {
        "python.mt19937": np.zeros(625, np.uint32),
        "numpy.mt19937": np.zeros(624, np.uint32),
        "torch.cpu": np.zeros(8, np.uint8),
    }
    host, framework = HostRng.split(arrays)
    assert sorted(host) == ["numpy.mt19937", "python.mt19937"] and list(framework) == ["torch.cpu"]
