"""JAX's persistent compilation cache, on by default: a JAX process loads the steps an earlier process on
this machine compiled (start-up ~10 s -> ~3.5 s here) instead of compiling them again.

The setting is one documented variable, REPROCUBE_JAX_CACHE (docs/configuration.md): unset, the cache lives
in ~/.cache/reprocube/jax; `off` compiles in every process; an absolute path puts it there. It is never part
of a run's config (a receipt would carry a path), and whatever the directory, entries live in a
subdirectory named by this machine's CPU (model and flags): a home directory shared by an AVX-512 and an
AVX2 node never hands one the other's code. A loaded step is the compiled one (JAX's key holds the HLO, the
XLA_FLAGS and the platform); tests/test_compilation_cache.py proves a cached run bit-identical to an
uncached one. verify's fresh checks set `off`: they must compile anew."""

from __future__ import annotations

import hashlib
import os
import stat
import sys
from pathlib import Path

from reprocube.env import cpu_signature

VARIABLE = "REPROCUBE_JAX_CACHE"
OFF = "off"


def cache_directory() -> Path | None:
    """Where this process's compiled steps are cached, or None (off, or no usable place)."""
    setting = os.environ.get(VARIABLE)
    if setting == OFF:
        return None
    if setting:
        base = Path(setting)
        if not base.is_absolute():
            _skip(f"{VARIABLE} must be an absolute path or 'off'")
            return None
    else:
        base = Path.home() / ".cache" / "reprocube" / "jax"
    machine = hashlib.sha256(cpu_signature().encode()).hexdigest()[:16]
    return base / f"cpu-{machine}"


def enable(jax) -> bool:
    """Point JAX at the cache (before its first compilation); False where it stays off. A directory that
    is a link, not a directory or not this user's is not used: JAX loads executables from it."""
    directory = cache_directory()
    if directory is None:
        jax.config.update("jax_compilation_cache_dir", None)  # also JAX's own JAX_COMPILATION_CACHE_DIR
        return False
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = directory.lstat()
    except OSError as error:
        _skip(f"cannot create {directory}: {error.strerror}")
        jax.config.update("jax_compilation_cache_dir", None)
        return False
    if not stat.S_ISDIR(info.st_mode) or (hasattr(os, "getuid") and info.st_uid != os.getuid()):
        _skip(f"{directory} is not a directory of this user")
        jax.config.update("jax_compilation_cache_dir", None)
        return False
    jax.config.update("jax_compilation_cache_dir", str(directory))
    # Every step, however fast it compiled: the small steps of short runs are the start-up we save.
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return True


def _skip(reason: str) -> None:
    print(f"reprocube: JAX compilation cache off: {reason}", file=sys.stderr)
