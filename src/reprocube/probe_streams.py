"""What the probe records of each step beside the weights (reprocube.probe): the streams that do not depend
on the numbers. A resume that restores them exactly gives the same streams as an uninterrupted run even where
non-deterministic kernels make the weights differ from the first step (../shared/notes/nondet.md): a
generator not restored, a data position lost or a schedule restarted each changes one of them at the first
update after the restart.

- Every random generator the probe can see without being told: torch's CPU generator and, once CUDA is
  initialized, each device's; NumPy's global one (legacy `np.random`); Python's `random`. Only a module the
  script has already imported is looked at (the probe imports no framework).
- The generators the script passes by name (`generators={"dropout": key}`): a JAX key (typed or raw), a
  `tf.random.Generator`, a `torch.Generator`, a `numpy.random.Generator`, or any array.
- The batch (`batch=`): its arrays' bytes, in order (a dict's in its keys' sorted order; a value that is no
  array, number or text by its type only). A batch on a GPU is copied to the host for it (one sync a step):
  pass the host batch where that matters.
- The learning rate (`lr=`): a number, or one per parameter group, recorded exactly.

Each stream is a 16-hex-digit digest (SHA-256's first 8 bytes) of its state's bytes: two digests are equal exactly where the
states are (up to a 2**-64 chance). Computed at the call (a generator's state moves on), on the host."""

from __future__ import annotations

import hashlib
import math
import re
import struct
import sys

DIGEST_BYTES = 8  # 16 hex digits
MAX_STREAMS = 64  # streams of one update a trace may hold (probe_trace reads no more)
MAX_PASSED = 32  # generators a script may pass by name
MAX_NAME = 100
NAME = re.compile(r"[^\x00-\x1f\x7f]{1,100}\Z")  # MAX_NAME characters, no control character
MAX_LEARNING_RATES = 1024  # parameter groups


def digest(*parts: bytes) -> str:
    """SHA-256, its first DIGEST_BYTES (twice BLAKE2b's speed where the CPU has SHA instructions)."""
    h = hashlib.sha256()
    for part in parts:
        h.update(len(part).to_bytes(8, "little"))  # a part's end is part of what is hashed
        h.update(part)
    return h.hexdigest()[: 2 * DIGEST_BYTES]


def seen_generators() -> dict[str, str]:
    """The digests of the generators of the modules the script imported (named torch, torch.cuda:N, numpy,
    python)."""
    streams = {}
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "random"):
        streams["torch"] = digest(torch.random.get_rng_state().numpy().tobytes())
        cuda = getattr(torch, "cuda", None)
        if cuda is not None and cuda.is_initialized():
            for device, state in enumerate(cuda.get_rng_state_all()):
                streams[f"torch.cuda:{device}"] = digest(state.numpy().tobytes())
    numpy_random = sys.modules.get("numpy.random")  # not numpy.random itself: NumPy imports it lazily
    if numpy_random is not None:
        state = numpy_random.get_state(legacy=False)
        inner = state["state"]
        flags = _words(inner["pos"], state["has_gauss"])
        streams["numpy"] = digest(
            state["bit_generator"].encode(), inner["key"].tobytes(), flags, repr(state["gauss"]).encode()
        )
    random = sys.modules.get("random")
    if random is not None:
        version, internal, gauss_next = random.getstate()  # 624 words and a position, each below 2**32
        streams["python"] = digest(struct.pack(f"<q{len(internal)}I", version, *internal), repr(gauss_next).encode())
    return streams


def passed_generators(generators) -> dict[str, str]:
    """The digests of the generators the script passed, by its names."""
    if generators is None:
        return {}
    names_ok = isinstance(generators, dict) and all(isinstance(k, str) and NAME.match(k) for k in generators)
    if not names_ok or len(generators) > MAX_PASSED:
        raise ValueError(
            f"reprocube probe: generators= must be a dict of at most {MAX_PASSED} names (1 to {MAX_NAME} "
            "characters, no control character) to generators"
        )
    return {f"passed.{name}": digest(_generator_bytes(value)) for name, value in generators.items()}


def batch_digest(batch) -> str:
    """The batch's arrays' bytes, with their dtypes and shapes, in order."""
    import numpy as np

    parts = []
    for value in _leaves(batch):
        array = np.ascontiguousarray(_host(value))
        if array.dtype.hasobject:  # an object's bytes would be its address: only its type is told
            parts.append(type(value).__qualname__.encode())
            continue
        parts += [array.dtype.str.encode(), _words(*array.shape), array.tobytes()]
    return digest(*parts)


def learning_rates(lr) -> list[float]:
    """The learning rate(s) as finite Python floats (a tensor or a variable read on the host)."""
    values = list(lr) if isinstance(lr, list | tuple) else [lr]
    rates = [float(_host(value)) for value in values]
    if not 0 < len(rates) <= MAX_LEARNING_RATES or not all(math.isfinite(r) for r in rates):
        raise ValueError(f"reprocube probe: lr= must be 1 to {MAX_LEARNING_RATES} finite numbers")
    return rates


def _words(*values: int) -> bytes:
    return b"".join(int(v).to_bytes(8, "little", signed=True) for v in values)


def _generator_bytes(value) -> bytes:
    import numpy as np

    if hasattr(value, "get_state") and callable(value.get_state):  # torch.Generator
        return value.get_state().numpy().tobytes()
    if hasattr(value, "bit_generator"):  # numpy.random.Generator
        return repr(sorted(value.bit_generator.state.items())).encode()
    if hasattr(value, "state") and hasattr(value, "algorithm"):  # tf.random.Generator
        return np.asarray(value.state.numpy()).tobytes()
    jax = sys.modules.get("jax")
    if jax is not None and hasattr(value, "dtype") and jax.dtypes.issubdtype(value.dtype, jax.dtypes.prng_key):
        value = jax.random.key_data(value)  # a typed key: its raw words
    return np.ascontiguousarray(_host(value)).tobytes()


def _host(value):
    """A framework's array (or a number) as NumPy's, on the host."""
    import numpy as np

    if hasattr(value, "detach"):  # torch
        return value.detach().cpu().numpy()
    if hasattr(value, "numpy") and callable(value.numpy):  # TensorFlow, a Keras variable
        return value.numpy()
    return np.asarray(value)


def _leaves(tree) -> list:
    if isinstance(tree, dict) or (hasattr(tree, "items") and hasattr(tree, "keys") and not hasattr(tree, "shape")):
        return [leaf for key in sorted(tree.keys(), key=str) for leaf in _leaves(tree[key])]
    if isinstance(tree, list | tuple):
        return [leaf for value in tree for leaf in _leaves(value)]
    return [tree]
