"""Stand-in for torchvision, used only by benchmarks/reference_tutorial.py.

torchvision cannot be imported on this machine (its compiled ops need libtorch_cuda, and torch is the
CPU build), so the reference tutorial's mnist_pytorch.py and mnist_jax.py get this package next to them
instead. It holds only what they use -- datasets.MNIST, transforms.Compose, ToTensor and Normalize --
and does per sample what torchvision does (uint8 tensor row -> PIL image -> ToTensor -> Normalize), so
the per-sample data cost, and so the epoch time, stays that of the original.
"""

from . import datasets, transforms  # noqa: F401  (the package's public modules)

__version__ = "0.0+reference-tutorial-standin"
