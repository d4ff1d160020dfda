"""The JAX trainer's network (Flax Linen) and the pure functions its jitted step computes with it: the loss,
the count of correct answers, the weight fingerprint; and the names of the parameters' and optimizer
state's leaves."""

from __future__ import annotations

import flax
import jax
import jax.numpy as jnp
from flax import linen as nn
from flax import traverse_util


class Net(nn.Module):
    """conv 1->10 k5, pool, relu, conv 10->20 k5, Dropout2d, pool, relu, dense 320->50, relu, dropout,
    dense 10 (channels-last). `conv2_as_matmul`: conv2 computed as image patches times its kernel (the
    same parameters; other bits)."""

    num_classes: int = 10
    conv2_as_matmul: bool = False

    @nn.compact
    def __call__(self, x, train: bool):
        x = nn.Conv(10, (5, 5), padding="VALID", name="conv1")(x)
        x = nn.relu(_max_pool_2x2(x))
        if self.conv2_as_matmul:
            x = PatchConv(20, (5, 5), name="conv2")(x)
        else:
            x = nn.Conv(20, (5, 5), padding="VALID", name="conv2")(x)
        x = nn.Dropout(0.5, broadcast_dims=(1, 2), deterministic=not train, name="conv2_drop")(x)  # whole channels
        x = nn.relu(_max_pool_2x2(x))
        x = x.reshape((x.shape[0], -1))
        x = nn.relu(nn.Dense(50, name="fc1")(x))
        x = nn.Dropout(0.5, deterministic=not train, name="fc1_drop")(x)
        return nn.Dense(self.num_classes, name="fc2")(x)


class PatchConv(nn.Module):
    """nn.Conv's VALID convolution (the same `kernel` and `bias`, initialised alike) as the input's image
    patches, cut by slicing, times the kernel reshaped to a matrix. On XLA's CPU backend a step is ~15%
    faster with conv2 in this form: its input gradient, a convolution there, becomes a matrix product and
    the sum of sliced windows (benchmarks/README.md). For conv1 (one input channel) it is not faster."""

    features: int
    kernel_size: tuple[int, int]

    @nn.compact
    def __call__(self, x):
        (kh, kw), channels = self.kernel_size, x.shape[-1]
        kernel = self.param("kernel", nn.initializers.lecun_normal(), (kh, kw, channels, self.features))
        bias = self.param("bias", nn.initializers.zeros_init(), (self.features,))
        oh, ow = x.shape[1] - kh + 1, x.shape[2] - kw + 1
        # (n, oh, ow, kh*kw*channels): window position major, channel minor, as the kernel's HWIO rows
        patches = jnp.concatenate([x[:, i : i + oh, j : j + ow, :] for i in range(kh) for j in range(kw)], axis=-1)
        return patches @ kernel.reshape(-1, self.features) + bias


def _max_pool_2x2(x):
    """2x2 max pooling, stride 2, as a reshape and a max: the same forward values as nn.max_pool, and on
    XLA's CPU backend a much cheaper gradient than reduce_window's select-and-scatter (about 15% of the
    whole step here). A tie sends the gradient to every maximum instead of the first."""
    n, h, w, c = x.shape
    return x.reshape(n, h // 2, 2, w // 2, 2, c).max(axis=(2, 4))


def weights_fingerprint(params):
    """Each weight's float32 bits summed as uint32 (wrapping: modulo 2**32), in sorted name order, inside
    the jitted step (reprocube.formats.trace.fingerprint)."""
    flat = flat_params(params)
    leaves = [flat[path] for path in sorted(flat, key=".".join)]
    return jnp.stack([_mix(jax.lax.bitcast_convert_type(leaf, jnp.uint32)).sum(dtype=jnp.uint32) for leaf in leaves])


def _mix(x):
    """reprocube.formats.trace.mix on uint32 (the product wraps modulo 2**32)."""
    return x ^ (x * x)


def nll_sum(logits, one_hot):
    return -jnp.sum(jax.nn.log_softmax(logits) * one_hot)


def count_correct(logits, one_hot):
    return jnp.sum(jnp.argmax(logits, axis=1) == jnp.argmax(one_hot, axis=1), dtype=jnp.int32)


def flat_params(params) -> dict[tuple[str, ...], jax.Array]:
    return traverse_util.flatten_dict(flax.core.unfreeze(params))


def path_name(path) -> str:
    return ".".join(str(getattr(p, "name", getattr(p, "key", getattr(p, "idx", p)))) for p in path)
