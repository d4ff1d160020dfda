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
            print(
                f"reprocube: JAX compilation cache off: {VARIABLE} must be an absolute path or 'off'", file=sys.stderr
            )
            return None
    else:
        base = Path.home() / ".cache" / "reprocube" / "jax"
    machine = hashlib.sha256(cpu_signature().encode()).hexdigest()[:16]
    return base / f"cpu-{machine}"


MAX_BYTES = 1 << 30  # JAX evicts the least recently used entries beyond this (a step is ~0.1 MB on the CPU)


def enable(jax) -> bool:
    """Point JAX at the cache (before its first compilation); False where it stays off. JAX loads and runs
    executables from that directory, so it is used only where no one else could have written them: the
    directory this user's with mode 0700, and every directory above it (links included) owned by this
    user or root and not writable by others unless sticky (/tmp), as ssh's StrictModes asks of ~/.ssh."""
    directory = cache_directory()
    if directory is None:
        return _off(jax)
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = directory.lstat()
        if stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid() and info.st_mode & 0o077:
            directory.chmod(0o700)  # ours, made by an older reprocube or by hand: closed
            info = directory.lstat()
    except OSError as error:
        return _off(jax, f"cannot create {directory}: {error.strerror}")
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        return _off(jax, f"{directory} is not a directory of this user's alone (a link, another owner, or open)")
    unsafe = _unsafe_parent(directory)
    if unsafe:
        return _off(jax, f"{unsafe} could be changed by another user")
    jax.config.update("jax_compilation_cache_dir", str(directory))
    # Every step, however fast it compiled: the small steps of short runs are the start-up we save.
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    jax.config.update("jax_compilation_cache_max_size", MAX_BYTES)
    # JAX's executables only: XLA's own GPU autotuning results are not kept here.
    jax.config.update("jax_persistent_cache_enable_xla_caches", "none")
    return bool(jax.config.jax_enable_compilation_cache)  # JAX_ENABLE_COMPILATION_CACHE=false: off after all


def _unsafe_parent(directory: Path) -> Path | None:
    """The first directory above `directory` (following links) that another user could change, or None."""
    path = Path(os.path.realpath(directory.parent))
    for parent in [path, *path.parents]:
        info = parent.stat()
        others_write = info.st_mode & 0o022 and not info.st_mode & stat.S_ISVTX
        if info.st_uid not in (0, os.getuid()) or others_write:
            return parent
    return None


def _off(jax, reason: str | None = None) -> bool:
    jax.config.update("jax_compilation_cache_dir", None)  # also JAX's own JAX_COMPILATION_CACHE_DIR
    if reason:
        print(f"reprocube: JAX compilation cache off: {reason}", file=sys.stderr)
    return False
