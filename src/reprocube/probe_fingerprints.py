"""What the probe records of each step, by the framework the values belong to (reprocube.probe): the
weights' names in sorted order, their fingerprints, computed with the framework's own operations where the
weights live and brought to the host only when the records are written, and the loss's exact bits. A
framework is imported only when a value of it is met, so that importing the probe stays light."""

from __future__ import annotations


def named_tensors(params) -> tuple[list[str], list]:
    """Names and tensors, in sorted name order, of a Module, a Keras model, a dict/pytree or a list."""
    if hasattr(params, "state_dict") and callable(params.state_dict):  # torch.nn.Module
        params = params.state_dict()
    elif hasattr(params, "weights") and not isinstance(params, dict | list | tuple):  # a Keras model or layer
        params = {getattr(v, "path", None) or v.name: getattr(v, "value", v) for v in params.weights}
    named = _flatten(params, "")
    named.sort(key=lambda item: item[0])
    return [name for name, _ in named], [tensor for _, tensor in named]


def _flatten(tree, prefix: str) -> list[tuple[str, object]]:
    if isinstance(tree, dict) or (hasattr(tree, "items") and hasattr(tree, "keys")):
        return [item for key in tree for item in _flatten(tree[key], f"{prefix}{key}.")]
    if isinstance(tree, list | tuple):
        return [item for i, value in enumerate(tree) for item in _flatten(value, f"{prefix}{i}.")]
    return [(prefix[:-1] or "0", tree)]


def array_fingerprint(tensor) -> int:
    """One host tensor's fingerprint as the probe records it (check's moved-weights restart finds a checkpoint's
    weights by it): the sum modulo 2**32 of its mixed 32-bit patterns (other widths cast to float32)."""
    import numpy as np

    array = np.ascontiguousarray(np.asarray(tensor)).reshape(-1)
    bits = array.view(np.uint32) if array.dtype.itemsize in (4, 8) else array.astype(np.float32).view(np.uint32)
    return int((bits ^ (bits * bits)).sum(dtype=np.uint32))


class _NumPy:
    """NumPy arrays, Python numbers, and anything else array-like: fingerprinted on the host. The other
    frameworks' adapters are this one with what they do otherwise."""

    @staticmethod
    def fingerprints(tensors):
        import numpy as np

        return np.array([array_fingerprint(tensor) for tensor in tensors], dtype=np.uint32)

    @staticmethod
    def to_host(fingerprints) -> list:
        import numpy as np

        return np.asarray(fingerprints).tolist()

    @staticmethod
    def snapshot(loss):
        import numpy as np

        copy = np.array(loss, copy=True)
        return copy, copy.size

    @classmethod
    def loss_bits(cls, loss) -> tuple[str, str]:
        return _array_bits(cls.to_numpy(loss))

    @staticmethod
    def to_numpy(value):
        import numpy as np

        return np.asarray(value)


class _Torch(_NumPy):
    """PyTorch tensors: fingerprinted with torch's own operations on the tensors' device."""

    @staticmethod
    def fingerprints(tensors):
        import torch

        sums = []
        for tensor in tensors:
            bits = _as_words(tensor.detach().reshape(-1), torch)
            sums.append((bits ^ (bits * bits)).sum(dtype=torch.int32))  # int32 wraps modulo 2**32
        return torch.stack(sums)

    @staticmethod
    def to_host(fingerprints) -> list:
        return fingerprints.cpu().tolist()

    @staticmethod
    def snapshot(loss):
        return loss.detach().clone(), loss.numel()

    @staticmethod
    def to_numpy(value):
        value = value.detach().cpu()
        return (value.float() if value.dtype.is_floating_point and value.element_size() < 4 else value).numpy()

    @staticmethod
    def loss_bits(loss) -> tuple[str, str]:
        import torch

        if loss.dtype == torch.bfloat16:  # NumPy has no bfloat16: its 16 bits as they are
            return loss.view(torch.int16).cpu().numpy().reshape(()).astype("<i2").tobytes().hex(), "bfloat16"
        return _array_bits(loss.detach().cpu().numpy())


class _Jax(_NumPy):
    """JAX arrays: fingerprinted by one compiled function (one dispatch a step, not one per tensor)."""

    compiled = None

    @classmethod
    def fingerprints(cls, tensors):
        if cls.compiled is None:
            import jax
            import jax.numpy as jnp

            def one(x):
                x = jnp.ravel(x)
                if x.dtype.itemsize != 4:
                    x = x.astype(jnp.float64) if x.dtype.itemsize == 8 else x.astype(jnp.float32)
                bits = jax.lax.bitcast_convert_type(x, jnp.uint32).reshape(-1)
                return (bits ^ (bits * bits)).sum(dtype=jnp.uint32)

            cls.compiled = jax.jit(lambda leaves: jnp.stack([one(x) for x in leaves]))
        return cls.compiled(list(tensors))

    @staticmethod
    def snapshot(loss):
        return loss, loss.size  # immutable


class _TensorFlow(_NumPy):
    """TensorFlow tensors and Keras variables: fingerprinted by one tf.function."""

    compiled = None

    @classmethod
    def fingerprints(cls, tensors):
        if cls.compiled is None:
            import tensorflow as tf

            def one(value):
                value = tf.reshape(value, [-1])
                if value.dtype.size != 4:
                    value = tf.cast(value, tf.float32)
                bits = tf.bitcast(value, tf.uint32)
                return tf.reduce_sum(bits ^ (bits * bits))

            cls.compiled = tf.function(lambda values: tf.stack([one(v) for v in values]), reduce_retracing=True)
        return cls.compiled([_variable_value(t) for t in tensors])

    @staticmethod
    def to_host(fingerprints) -> list:
        return fingerprints.numpy().tolist()

    @staticmethod
    def snapshot(loss):
        import tensorflow as tf

        copy = tf.identity(loss)
        return copy, int(tf.size(copy))

    @staticmethod
    def to_numpy(value):
        import numpy as np

        value = _variable_value(value)
        return np.asarray(value.numpy() if hasattr(value, "numpy") else value)


# The framework a value belongs to, by the module its type comes from; anything else is NumPy's.
_ADAPTERS = (("torch", _Torch), ("jax", _Jax), ("jaxlib", _Jax), ("tensorflow", _TensorFlow), ("keras", _TensorFlow))
_chosen: dict[type, type] = {}  # each type's adapter, chosen once


def _adapter(value) -> type:
    kind = type(value)
    adapter = _chosen.get(kind)
    if adapter is None:
        module = kind.__module__
        adapter = _chosen[kind] = next((a for prefix, a in _ADAPTERS if module.startswith(prefix)), _NumPy)
    return adapter


def _variable_value(value):
    """A Keras variable's tensor (its `value`), else the value itself."""
    return value.value if hasattr(value, "value") and not callable(value.value) else value


def weight_fingerprints(tensors: list):
    """One uint32 (or wrapping int) per tensor, left on the tensors' device until flush, with the adapter
    that brings them to the host."""
    if not tensors:
        return _NumPy, []
    adapters = {_adapter(t) for t in tensors}
    if len(adapters) > 1:  # weights of several frameworks: each brought to the host (rare; a sync)
        return _NumPy, _NumPy.fingerprints([_adapter(t).to_numpy(t) for t in tensors])
    adapter = adapters.pop()
    return adapter, adapter.fingerprints(tensors)


def _as_words(flat, torch):
    """A flat tensor's bits as int32 words (8-byte elements give two, 1- and 2-byte ones are widened)."""
    if flat.element_size() in (4, 8):
        return flat.contiguous().view(torch.int32)
    return flat.to(torch.float32).view(torch.int32)


def snapshot_of(loss):
    """The loss as it is now (a buffer the script reuses must not change what was recorded), checked to
    be one number here, where the script's line is in the traceback."""
    copy, size = _adapter(loss).snapshot(loss)
    if size != 1:
        raise ValueError(f"reprocube probe: the loss must be one number, got {size}")
    return copy


def loss_bits(loss) -> tuple[str, str]:
    """The loss's exact bits, hex, little-endian, with its dtype: float16, bfloat16, float32 or float64
    (a Python float is float64; any other number is recorded as a float64)."""
    return _adapter(loss).loss_bits(loss)


def _array_bits(array) -> tuple[str, str]:
    import numpy as np

    array = np.asarray(array).reshape(())
    if array.dtype.name == "bfloat16":  # JAX's (ml_dtypes)
        return array.tobytes().hex(), "bfloat16"
    if array.dtype.name not in ("float16", "float32", "float64"):
        array = array.astype(np.float64)
    array = array.astype(array.dtype.newbyteorder("<"))
    return array.tobytes().hex(), array.dtype.name
