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

import errno
import hashlib
import os
import pwd
import stat
import sys
from pathlib import Path

from reprocube.formats.env import cpu_signature

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
        home = _home()
        if home is None:
            return None
        base = home / ".cache" / "reprocube" / "jax"
    machine = hashlib.sha256(cpu_signature().encode()).hexdigest()[:16]
    return base / f"cpu-{machine}"


def _home() -> Path | None:
    """This user's home directory (HOME, else the passwd entry), or None with one line: there is none
    (a uid without a passwd entry and no HOME, as `docker run --user`), or it is not an absolute path
    (HOME='~nobody', HOME=x/y: refused, as a relative REPROCUBE_JAX_CACHE is, never resolved from the
    current directory)."""
    home = os.environ.get("HOME")
    if home is None:
        try:
            home = pwd.getpwuid(os.getuid()).pw_dir
        except KeyError:
            return _no_home(f"HOME is unset and uid {os.getuid()} has no passwd entry")
        where = f"the home directory of uid {os.getuid()} ({home!r})"
    else:
        where = f"HOME ({home!r})"
    if not os.path.isabs(home):
        return _no_home(f"{where} is not an absolute path")
    return Path(home)


def _no_home(why: str) -> None:
    print(f"reprocube: JAX compilation cache off: {why}; set {VARIABLE} to an absolute path", file=sys.stderr)
    return None


MAX_BYTES = 1 << 30  # JAX evicts the least recently used entries beyond this (a step is ~0.1 MB on the CPU)


def enable(jax) -> bool:
    """Point JAX at the cache (before its first compilation); False where it stays off. JAX loads and runs
    executables from that directory, so it is used only where no one else could have written them or
    could redirect the path to a directory of theirs (`_opened` has the rule). JAX is given the resolved
    path that was checked, never a link; it opens its cache here, and the path is checked once more after
    that: the directory JAX opened is the one that was checked."""
    directory = cache_directory()
    if directory is None:
        return _off(jax)
    try:
        base, base_fd = _opened(directory.parent, create=True)
        try:
            checked = _own_directory(base_fd, base / directory.name, create=True)
        finally:
            os.close(base_fd)
    except _Refused as refusal:
        return _off(jax, str(refusal))
    except OSError as error:  # anything else the file system says (the line names the cache, never a traceback)
        return _off(jax, f"cannot use {directory}: {error.strerror or error}")
    resolved = base / directory.name
    jax.config.update("jax_compilation_cache_dir", str(resolved))
    # Every step, however fast it compiled: the small steps of short runs are the start-up we save.
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    jax.config.update("jax_compilation_cache_max_size", MAX_BYTES)
    # JAX's executables only: XLA's own GPU autotuning results are not kept here.
    jax.config.update("jax_persistent_cache_enable_xla_caches", "none")
    if not jax.config.jax_enable_compilation_cache:  # JAX_ENABLE_COMPILATION_CACHE=false: off after all
        return False
    try:
        _open_jax_cache(jax)
        base, base_fd = _opened(resolved.parent, create=False)
        try:
            again = _own_directory(base_fd, resolved, create=False)
        finally:
            os.close(base_fd)
    except _Refused as refusal:
        return _off(jax, f"{refusal} (after JAX opened it)")
    except (OSError, RuntimeError) as error:  # JAX's own: its directory or lock file, filelock missing
        return _off(jax, f"JAX could not open {resolved}: {error}")
    if base != resolved.parent or again != checked:
        return _off(jax, f"{resolved} changed between its check and JAX opening it")
    return True


class _Refused(Exception):
    """Why the cache is not used (one line)."""


_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
MAX_LINKS = 40  # followed in one path, as the kernel's own limit


def _opened(path: Path, create: bool) -> tuple[Path, int]:
    """`path` opened one component at a time from /, each through a descriptor of the directory above it
    and checked before it is used, links followed here rather than by the kernel; missing directories
    made (0755 less the umask) when `create`. Returns the resolved path and a descriptor of it (the
    caller closes it), or raises _Refused.

    The rule, each component (links included) in the order the walk meets it:
    - it belongs to this user or root (a link's owner too: the owner of a link can point it elsewhere);
    - a directory is writable by no one else (group or others), except a sticky one (/tmp): there another
      user may add entries but not rename or remove this user's or root's, so it may hold the path's next
      component, and the next component is under the same rule. Only a directory above the cache can be
      such: the cache's own directory must be this user's, mode 0700 (`_own_directory`).
    Once a directory passes, no one but this user and root can change what its next component names, so
    the checked path cannot be redirected by another user afterwards (ACLs and other users' root are not
    considered)."""
    me = os.geteuid()
    root = os.open("/", _DIRECTORY)
    stack: list[tuple[str, int]] = [("/", root)]
    try:
        _check_directory(Path("/"), os.fstat(root), me)
        pending = list(reversed(path.parts[1:]))  # a stack: the next component last
        links = 0
        while pending:
            name = pending.pop()
            if name == "..":
                if len(stack) > 1:
                    os.close(stack.pop()[1])
                continue
            if name in ("", "."):
                continue
            here = Path("/", *(n for n, _ in stack[1:]), name)
            parent = stack[-1][1]
            info = _lstat(name, parent, here, create)
            if info.st_uid not in (0, me):
                raise _Refused(f"{here} belongs to another user (uid {info.st_uid}), who could change it")
            if stat.S_ISLNK(info.st_mode):
                links += 1
                if links > MAX_LINKS:
                    raise _Refused(f"{here}: more than {MAX_LINKS} links")
                try:
                    target = Path(os.readlink(name, dir_fd=parent))
                except OSError as error:
                    raise _Refused(f"cannot read the link {here}: {error.strerror}") from None
                if target.is_absolute():
                    while len(stack) > 1:
                        os.close(stack.pop()[1])
                pending.extend(reversed(target.parts[1:] if target.is_absolute() else target.parts))
                continue
            if not stat.S_ISDIR(info.st_mode):
                raise _Refused(f"{here} is not a directory")
            try:
                fd = os.open(name, _DIRECTORY, dir_fd=parent)  # O_NOFOLLOW: never a link put there since
            except OSError as error:
                raise _Refused(f"cannot open {here}: {error.strerror}") from None
            stack.append((name, fd))
            opened = os.fstat(fd)
            if (opened.st_dev, opened.st_ino) != (info.st_dev, info.st_ino):
                raise _Refused(f"{here} changed while it was checked")
            _check_directory(here, opened, me)
        resolved = Path("/", *(n for n, _ in stack[1:]))
        fd = stack.pop()[1]
        return resolved, fd
    finally:
        for _, fd in stack:
            os.close(fd)


def _lstat(name: str, parent: int, here: Path, create: bool) -> os.stat_result:
    try:
        return os.stat(name, dir_fd=parent, follow_symlinks=False)
    except FileNotFoundError:
        if not create:
            raise _Refused(f"{here} does not exist") from None
    except OSError as error:
        raise _Refused(f"cannot read {here}: {error.strerror}") from None
    try:
        os.mkdir(name, 0o755, dir_fd=parent)
    except FileExistsError:
        pass  # made meanwhile: checked as any other
    except OSError as error:
        raise _Refused(f"cannot create {here}: {error.strerror}") from None
    return _lstat(name, parent, here, create=False)


def _check_directory(here: Path, info: os.stat_result, me: int) -> None:
    if info.st_uid not in (0, me):
        raise _Refused(f"{here} belongs to another user (uid {info.st_uid}), who could change it")
    if info.st_mode & 0o022 and not info.st_mode & stat.S_ISVTX:
        raise _Refused(f"{here} could be changed by another user (writable by its group or others, not sticky)")


def _own_directory(parent: int, path: Path, create: bool) -> tuple[int, int]:
    """The cache's own directory, `path` in the directory open as `parent`: a directory (not a link) of
    this user's, writable by no one else, and (when `create`, before JAX is given it) holding nothing but
    regular files of this user's (`_check_entries`). Returns its device and inode.

    One that is (or was) writable by others is refused, never closed and used: whatever it holds may be
    another user's, and JAX loads and runs it (and writes through a link it finds there). One of ours only
    readable by others (0755: made by hand) is closed to 0700; where it cannot be (a read-only file
    system) it is refused."""
    name, me = path.name, os.geteuid()
    if create:
        try:
            os.mkdir(name, 0o700, dir_fd=parent)
        except FileExistsError:
            pass
        except OSError as error:
            raise _Refused(f"cannot create {path}: {error.strerror}") from None
    alone = f"{path} is not a directory of this user's alone (a link, another owner, or open)"
    try:
        fd = os.open(name, _DIRECTORY, dir_fd=parent)
    except OSError as error:
        if error.errno in (errno.ELOOP, errno.ENOTDIR):
            raise _Refused(alone) from None
        raise _Refused(f"cannot open {path}: {error.strerror}") from None
    try:
        info = os.fstat(fd)
        if info.st_uid != me:
            raise _Refused(alone)
        mode = stat.S_IMODE(info.st_mode)
        if mode & 0o022:
            raise _Refused(
                f"{path} is writable by others (mode {mode:04o}), so what it holds may be another user's code:"
                " remove it and reprocube makes a new one (closing it is not enough)"
            )
        if create:
            _check_entries(fd, path, me, was_open=bool(mode & 0o077))
        if mode & 0o077:
            if not create:
                raise _Refused(alone)
            try:
                os.fchmod(fd, 0o700)  # ours, readable by others (made by hand or an older reprocube): closed
            except OSError as error:
                raise _Refused(f"cannot close {path} (mode {mode:04o}) to 0700: {error.strerror}") from None
        return info.st_dev, info.st_ino
    finally:
        os.close(fd)


def _check_entries(fd: int, path: Path, me: int, was_open: bool) -> None:
    """Everything in the cache's directory (open as `fd`) is a regular file of this user's with one name,
    and, where the directory was open to others (`was_open`: about to be closed), writable by no one else
    (under a umask of 002 JAX writes 0664 entries, out of others' reach in a 0700 directory):
    JAX reads and writes its entries by name, following links, so a link (to another user's compiled
    code, or to a file of ours that JAX would overwrite with an access time), a hard link, another
    user's file, a subdirectory, a FIFO or a device there turns the cache off."""
    with os.scandir(fd) as entries:
        for entry in entries:
            try:
                info = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue  # evicted meanwhile by a JAX process of ours
            what = None
            if stat.S_ISLNK(info.st_mode):
                what = "a symbolic link"
            elif not stat.S_ISREG(info.st_mode):
                what = "not a regular file"
            elif info.st_uid != me:
                what = f"a file of another user (uid {info.st_uid})"
            elif info.st_nlink != 1:
                what = f"a file with {info.st_nlink} names (hard links)"
            elif was_open and info.st_mode & 0o022:  # others could reach it: they may have written code into it
                what = f"a file others could write (mode {stat.S_IMODE(info.st_mode):04o})"
            if what:
                raise _Refused(
                    f"{path / entry.name} is {what}: JAX would follow it or load it; remove {path}"
                    " (reprocube makes a new one)"
                )


def _open_jax_cache(jax) -> None:
    """JAX opens its cache at its first compilation; here it opens it now (at the path just set, a cache
    opened before set aside), so the check that follows is of what JAX opened. A JAX without these
    functions opens it later, at a path no other user can redirect (the rule of `_opened`)."""
    internals = getattr(getattr(jax, "_src", None), "compilation_cache", None)
    reset, initialize = getattr(internals, "reset_cache", None), getattr(internals, "_initialize_cache", None)
    if reset is not None and initialize is not None:
        reset()
        initialize()


def _off(jax, reason: str | None = None) -> bool:
    jax.config.update("jax_compilation_cache_dir", None)  # also JAX's own JAX_COMPILATION_CACHE_DIR
    reset = getattr(getattr(getattr(jax, "_src", None), "compilation_cache", None), "reset_cache", None)
    if reset is not None:
        reset()  # a cache JAX opened (at the directory refused after it opened it) is not used either
    if reason:
        print(f"reprocube: JAX compilation cache off: {reason}", file=sys.stderr)
    return False
