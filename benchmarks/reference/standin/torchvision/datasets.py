"""torchvision.datasets.MNIST, reduced to what the reference scripts use: reads the IDX files that
torchvision keeps in ROOT/MNIST/raw/ and returns (PIL image, int label) pairs like torchvision does.
It never downloads: the files must already be there (the benchmark script writes them)."""

import os

import numpy as np
import torch
from PIL import Image

IMAGES_MAGIC = 2051
LABELS_MAGIC = 2049


def read_idx(path: str, magic: int) -> np.ndarray:
    """Reads an uncompressed big-endian IDX file of unsigned bytes (MNIST's format)."""
    with open(path, "rb") as f:
        raw = f.read()
    header = np.frombuffer(raw, dtype=">u4", count=1)[0]
    if header != magic:
        raise RuntimeError(f"{path}: IDX magic {header}, expected {magic}")
    ndim = magic & 0xFF
    shape = tuple(int(n) for n in np.frombuffer(raw, dtype=">u4", count=ndim, offset=4))
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(shape)


class MNIST(torch.utils.data.Dataset):
    def __init__(self, root, train=True, transform=None, target_transform=None, download=False):
        self.root = root
        self.train = train
        self.transform = transform
        self.target_transform = target_transform
        prefix = "train" if train else "t10k"
        raw_folder = os.path.join(root, "MNIST", "raw")
        images_path = os.path.join(raw_folder, f"{prefix}-images-idx3-ubyte")
        labels_path = os.path.join(raw_folder, f"{prefix}-labels-idx1-ubyte")
        if not (os.path.exists(images_path) and os.path.exists(labels_path)):
            raise RuntimeError(f"Dataset not found in {raw_folder} (this stand-in cannot download)")
        # As torchvision: a uint8 tensor (N, 28, 28) and int64 targets.
        self.data = torch.from_numpy(read_idx(images_path, IMAGES_MAGIC).copy())
        self.targets = torch.from_numpy(read_idx(labels_path, LABELS_MAGIC).astype(np.int64))

    def __getitem__(self, index):
        img, target = self.data[index], int(self.targets[index])
        # As torchvision, a PIL image per sample; mode "L" is what fromarray infers for 2-D uint8
        # (Pillow 13 deprecates passing it).
        img = Image.fromarray(img.numpy())
        if self.transform is not None:
            img = self.transform(img)
        if self.target_transform is not None:
            target = self.target_transform(target)
        return img, target

    def __len__(self):
        return len(self.data)
