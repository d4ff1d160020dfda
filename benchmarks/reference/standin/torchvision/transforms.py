"""torchvision.transforms Compose, ToTensor and Normalize, doing what torchvision's do for the
reference scripts' input (8-bit grayscale PIL images), including their per-call API-usage log."""

import numpy as np
import torch


class Compose:
    def __init__(self, transforms):
        self.transforms = transforms

    def __call__(self, img):
        for t in self.transforms:
            img = t(img)
        return img


class ToTensor:
    """PIL image (H, W) of mode L -> float tensor (1, H, W) in [0, 1], as torchvision's to_tensor."""

    def __call__(self, pic):
        torch._C._log_api_usage_once("torchvision.transforms.functional.to_tensor")
        if pic.mode != "L":
            raise TypeError(f"this stand-in only handles mode L images, got {pic.mode}")
        img = torch.from_numpy(np.array(pic, np.uint8, copy=True))
        img = img.view(pic.size[1], pic.size[0], 1)
        img = img.permute((2, 0, 1)).contiguous()
        return img.to(dtype=torch.get_default_dtype()).div(255)


class Normalize(torch.nn.Module):
    """(tensor - mean) / std per channel, not in place, as torchvision's normalize (also an nn.Module there)."""

    def __init__(self, mean, std, inplace=False):
        super().__init__()
        self.mean = mean
        self.std = std
        self.inplace = inplace

    def forward(self, tensor):
        torch._C._log_api_usage_once("torchvision.transforms.functional.normalize")
        if not self.inplace:
            tensor = tensor.clone()
        mean = torch.as_tensor(self.mean, dtype=tensor.dtype, device=tensor.device)
        std = torch.as_tensor(self.std, dtype=tensor.dtype, device=tensor.device)
        if (std == 0).any():
            raise ValueError(f"std evaluated to zero after conversion to {tensor.dtype}")
        if mean.ndim == 1:
            mean = mean.view(-1, 1, 1)
        if std.ndim == 1:
            std = std.view(-1, 1, 1)
        return tensor.sub_(mean).div_(std)
