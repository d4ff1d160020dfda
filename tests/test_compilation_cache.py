"""reprocube's JAX compilation cache (on by default): a run that loads its compiled steps from the cache
is bit-identical to one that compiled them, `off` compiles anew, and only a directory of this user is used."""

from __future__ import annotations

import errno
import json
import os
import pwd
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from reprocube.runtime import compilation_cache

from helpers import epoch_digests, reprocube

HIT = "Persistent compilation cache hit"


class _Config:
    jax_enable_compilation_cache = True

    def __init__(self):
        self.values = {}

    def update(self, name, value):
        self.values[name] = value


class _FakeJax:
    """What enable() touches of jax: its config (no JAX needed to test where the cache goes)."""

    def __init__(self):
        self.config = _Config()


def test_the_cache_is_on_by_default_in_a_directory_per_cpu(monkeypatch, tmp_path):
    monkeypatch.delenv(compilation_cache.VARIABLE, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    jax = _FakeJax()
    assert compilation_cache.enable(jax)
    directory = Path(jax.config.values["jax_compilation_cache_dir"])
    assert directory.parent == tmp_path / ".cache" / "reprocube" / "jax" and directory.name.startswith("cpu-")
    assert directory.is_dir() and directory.stat().st_mode & 0o777 == 0o700
    assert jax.config.values["jax_persistent_cache_min_compile_time_secs"] == 0
    # Another CPU (its flags) gets another directory: a shared home never hands one machine the other's code.
    monkeypatch.setattr(compilation_cache, "cpu_signature", lambda: "x86_64\nAMD EPYC\navx2 fma")
    assert compilation_cache.cache_directory() != directory


@pytest.mark.parametrize("setting", ["off", "relative/path"])
def test_off_or_a_relative_path_compiles_in_every_process(monkeypatch, capsys, setting):
    monkeypatch.setenv(compilation_cache.VARIABLE, setting)
    jax = _FakeJax()
    assert not compilation_cache.enable(jax)
    assert jax.config.values == {"jax_compilation_cache_dir": None}  # JAX's own variable is overridden too
    expected = "" if setting == "off" else "reprocube: JAX compilation cache off: REPROCUBE_JAX_CACHE must be"
    assert capsys.readouterr().err.startswith(expected)


def test_a_linked_cache_directory_is_not_used(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv(compilation_cache.VARIABLE, str(tmp_path / "cache"))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    directory = compilation_cache.cache_directory()
    directory.parent.mkdir()
    directory.symlink_to(elsewhere)
    jax = _FakeJax()
    assert not compilation_cache.enable(jax)
    assert jax.config.values == {"jax_compilation_cache_dir": None}
    assert "is not a directory of this user's alone" in capsys.readouterr().err
    assert not any(elsewhere.iterdir())


def test_a_cache_that_others_could_change_is_not_used(monkeypatch, capsys, tmp_path):
    """JAX runs what it loads from the cache: a parent directory anyone may write (not sticky) turns it
    off; our own directory only readable by others is closed to 0700 and used."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    monkeypatch.setenv(compilation_cache.VARIABLE, str(shared / "cache"))
    jax = _FakeJax()
    assert not compilation_cache.enable(jax)
    assert f"{shared} could be changed by another user" in capsys.readouterr().err
    assert not any(shared.iterdir())  # nothing is made below a directory refused
    shared.chmod(0o755)
    directory = compilation_cache.cache_directory()
    directory.mkdir(parents=True)
    directory.chmod(0o755)
    (directory / "jit_step-0123-cache").write_bytes(b"ours")  # JAX's own entries are used
    (directory / ".lockfile").write_bytes(b"")
    assert compilation_cache.enable(jax) and directory.stat().st_mode & 0o777 == 0o700
    assert jax.config.values["jax_persistent_cache_enable_xla_caches"] == "none"


def _refused_with_one_line(capsys, jax) -> str:
    assert not compilation_cache.enable(jax)
    assert jax.config.values == {"jax_compilation_cache_dir": None}
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("reprocube: JAX compilation cache off: ")
    return line


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o703, 0o1777])
def test_a_cache_directory_of_ours_left_writable_by_others_is_refused_not_closed(monkeypatch, capsys, tmp_path, mode):
    """Issue 55 F2: another user may have put anything in a directory that was open (links at cache keys
    to their compiled code, ran by JAX): closing it and using it used to run their code. It is refused,
    as it was found: nothing is repaired behind the user's back."""
    monkeypatch.setenv(compilation_cache.VARIABLE, str(tmp_path))
    directory = compilation_cache.cache_directory()
    directory.mkdir()
    directory.chmod(mode)
    line = _refused_with_one_line(capsys, _FakeJax())
    assert f"{directory} is writable by others (mode {mode:04o})" in line and "remove it" in line
    assert directory.stat().st_mode & 0o7777 == mode


def _plant(directory: Path, kind: str, tmp_path: Path) -> str:
    """Something that is not a regular file of this user's with one name, at a cache key's name."""
    name = "jit__lambda-0123abcd-cache"
    target = tmp_path / "target"
    target.write_bytes(b"compiled elsewhere")
    if kind == "link":
        (directory / name).symlink_to(target)
    elif kind == "atime link":
        name = "jit__lambda-0123abcd-atime"
        (directory / name).symlink_to(target)  # JAX writes the access time through it: target overwritten
    elif kind == "lock link":
        name = ".lockfile"
        (directory / name).symlink_to(target)
    elif kind == "dangling link":
        (directory / name).symlink_to(tmp_path / "not-yet")
    elif kind == "hard link":
        os.link(target, directory / name)
    elif kind == "directory":
        (directory / name).mkdir(mode=0o700)
    elif kind == "fifo":
        os.mkfifo(directory / name, 0o600)
    elif kind in ("writable", "group-writable"):  # ours, but another user could write code into it
        (directory / name).write_bytes(b"ours")
        os.chmod(directory / name, 0o666 if kind == "writable" else 0o664)
    return name


@pytest.mark.parametrize(
    ("kind", "said"),
    [
        ("link", "a symbolic link"),
        ("atime link", "a symbolic link"),
        ("lock link", "a symbolic link"),
        ("dangling link", "a symbolic link"),
        ("hard link", "a file with 2 names"),
        ("directory", "not a regular file"),
        ("fifo", "not a regular file"),
        ("writable", "a file others could write (mode 0666)"),
        ("group-writable", "a file others could write (mode 0664)"),
    ],
)
def test_a_cache_directory_holding_anything_but_our_regular_files_is_refused(monkeypatch, capsys, tmp_path, kind, said):
    """Issue 55 F2: what was planted while the directory was open stays after it was closed (by reprocube
    of old, or by hand). JAX follows links at its entries' names (loading the target, or writing the
    access time through it): nothing but this user's regular files may be there."""
    monkeypatch.setenv(compilation_cache.VARIABLE, str(tmp_path / "cache"))
    directory = compilation_cache.cache_directory()
    directory.mkdir(parents=True, mode=0o700)
    (directory / "jit_ours-cache").write_bytes(b"ours")
    name = _plant(directory, kind, tmp_path)
    if kind in ("writable", "group-writable"):  # reachable only where the directory was open (0755 by hand)
        directory.chmod(0o755)
    line = _refused_with_one_line(capsys, _FakeJax())
    assert f"{directory / name} is {said}" in line
    assert (tmp_path / "target").read_bytes() == b"compiled elsewhere"


@pytest.mark.process
def test_a_file_of_another_user_in_the_cache_directory_is_refused(monkeypatch, capsys, tmp_path, other_user):
    monkeypatch.setenv(compilation_cache.VARIABLE, str(tmp_path / "cache"))
    directory = compilation_cache.cache_directory()
    directory.mkdir(parents=True, mode=0o700)
    planted = directory / "jit_step-0123-cache"
    planted.write_bytes(b"their compiled code")
    os.chown(planted, other_user, other_user)
    line = _refused_with_one_line(capsys, _FakeJax())
    assert f"{planted} is a file of another user (uid {other_user})" in line


@pytest.mark.parametrize(
    ("home", "said"),
    [
        (None, "HOME is unset and uid {uid} has no passwd entry"),  # docker run --user 4242
        ("~nobody", "HOME ('~nobody') is not an absolute path"),
        ("", "HOME ('') is not an absolute path"),
        ("x{tmp}/d", "HOME ('x{tmp}/d') is not an absolute path"),  # used to be walked as {tmp}/d
    ],
)
def test_no_home_directory_or_a_relative_one_turns_the_cache_off_in_one_line(monkeypatch, capsys, tmp_path, home, said):
    """Issue 55 F3/F4: no home directory used to end the run in a traceback (Path.home()); a relative HOME
    was walked from / without its first component. Neither is guessed: the cache is off, one line."""
    monkeypatch.delenv(compilation_cache.VARIABLE, raising=False)
    if home is None:
        monkeypatch.delenv("HOME", raising=False)

        def no_entry(uid):
            raise KeyError(f"getpwuid(): uid not found: {uid}")

        monkeypatch.setattr(pwd, "getpwuid", no_entry)
    else:
        monkeypatch.setenv("HOME", home.format(tmp=tmp_path))
    line = _refused_with_one_line(capsys, _FakeJax())
    assert said.format(uid=os.getuid(), tmp=tmp_path) in line and "set REPROCUBE_JAX_CACHE" in line
    assert not any(tmp_path.iterdir())  # nothing made where the relative path would have been walked


def test_a_cache_directory_that_cannot_be_closed_turns_the_cache_off(monkeypatch, capsys, tmp_path):
    """Issue 55 F5: a 0755 directory of ours on a read-only file system: closing it failed with an OSError
    that ended `train` (exit 1, "Read-only file system"). The cache is off, the line names the directory."""
    monkeypatch.setenv(compilation_cache.VARIABLE, str(tmp_path))
    directory = compilation_cache.cache_directory()
    directory.mkdir(mode=0o755)

    def read_only(fd, mode):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    monkeypatch.setattr(os, "fchmod", read_only)
    line = _refused_with_one_line(capsys, _FakeJax())
    assert line.endswith(f"cannot close {directory} (mode 0755) to 0700: Read-only file system")


@pytest.mark.process
def test_a_run_from_the_cache_is_bit_identical_to_a_compiled_one(generated, tmp_path):
    """Three JAX runs of one config: compiling into an empty cache, loading every step from it, and with
    the cache off. JAX_LOG_COMPILES makes JAX say each cache hit (a warning)."""
    cache = tmp_path / "cache"
    runs = {}
    for name, setting in (("cold", str(cache)), ("warm", str(cache)), ("off", "off")):
        proc = reprocube(
            "train",
            "framework=jax",
            *generated.overrides(),
            "epochs=2",
            f"run_name={name}",
            cwd=tmp_path,
            env_extra={compilation_cache.VARIABLE: setting, "JAX_LOG_COMPILES": "1"},
        )
        run = tmp_path / "runs" / name
        env = json.loads((run / "env.json").read_text())
        runs[name] = (epoch_digests(run), env["framework"]["compilation_cache"], HIT in proc.stderr)
    assert runs["cold"][1:] == ("on", False) and runs["warm"][1:] == ("on", True) and runs["off"][1:] == ("off", False)
    assert runs["cold"][0] == runs["warm"][0] == runs["off"][0] and len(runs["cold"][0]) == 2
    entries = [p for p in cache.rglob("*") if p.is_file()]
    assert entries and all(os.stat(p).st_uid == os.getuid() for p in entries)


# --- another local user's ways to plant code in the cache (docs/configuration.md has the rule) ----------


@pytest.fixture(scope="module")
def other_user() -> int:
    """A second local user (made for these tests, removed after): the uid that owns what is planted."""
    if os.geteuid() != 0 or shutil.which("useradd") is None:
        pytest.skip("making a second local user needs root and useradd")
    name = f"rcube{os.getpid()}"
    subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name], check=True)
    try:
        yield pwd.getpwnam(name).pw_uid
    finally:
        subprocess.run(["userdel", name], check=False)


def _mine(tmp_path: Path) -> Path:
    """A directory of this user's, closed to others, that a link may point to."""
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o755)
    return mine


@pytest.mark.process
@pytest.mark.parametrize(
    ("planting", "mode", "owner"),
    [
        ("group-writable", 0o775, "me"),
        ("others-writable", 0o757, "me"),
        ("another user's", 0o755, "other"),
        ("another user's, sticky", 0o1777, "other"),
    ],
)
def test_a_link_in_a_directory_another_user_could_change_is_not_followed(
    monkeypatch, capsys, tmp_path, other_user, planting, mode, owner
):
    """The link itself is ours and points to a directory of ours, but the directory holding it could be
    changed by another user: they could replace the link. Only the link's target used to be checked."""
    mine = _mine(tmp_path)
    holder = tmp_path / "holder"
    holder.mkdir()
    (holder / "cache").symlink_to(mine)
    holder.chmod(mode)
    if owner == "other":
        os.chown(holder, other_user, other_user)
    monkeypatch.setenv(compilation_cache.VARIABLE, str(holder / "cache"))
    jax = _FakeJax()
    assert not compilation_cache.enable(jax), planting
    assert jax.config.values == {"jax_compilation_cache_dir": None}
    [line] = capsys.readouterr().err.splitlines()
    reason = "could be changed by another user" if owner == "me" else f"belongs to another user (uid {other_user})"
    assert line.startswith(f"reprocube: JAX compilation cache off: {holder} ") and reason in line
    assert not any(mine.iterdir())  # nothing made through it


@pytest.mark.process
def test_a_link_owned_by_another_user_is_not_followed(monkeypatch, capsys, tmp_path, other_user):
    """Whoever owns a link can point it elsewhere: it used to pass when its target was ours."""
    mine = _mine(tmp_path)
    link = tmp_path / "cache"
    link.symlink_to(mine)
    os.lchown(link, other_user, other_user)
    monkeypatch.setenv(compilation_cache.VARIABLE, str(link))
    jax = _FakeJax()
    assert not compilation_cache.enable(jax)
    assert jax.config.values == {"jax_compilation_cache_dir": None}
    err = capsys.readouterr().err
    assert (
        err
        == f"reprocube: JAX compilation cache off: {link} belongs to another user (uid {other_user}), who could change it\n"
    )
    assert not any(mine.iterdir())


@pytest.mark.process
def test_a_directory_of_another_user_above_the_cache_is_refused(monkeypatch, capsys, tmp_path, other_user):
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, other_user, other_user)
    monkeypatch.setenv(compilation_cache.VARIABLE, str(theirs / "cache"))
    assert not compilation_cache.enable(_FakeJax())
    assert f"{theirs} belongs to another user (uid {other_user})" in capsys.readouterr().err
    assert not any(theirs.iterdir())


def test_links_of_this_user_in_a_sticky_directory_are_followed_and_jax_gets_the_resolved_path(monkeypatch, tmp_path):
    """A sticky directory of root's that anyone may write (/tmp) may hold the path (its entries are
    renamed or removed by their owners only), and a link of ours there is followed. JAX gets the
    resolved path: swapping the link afterwards (only we could) does not move JAX's cache."""
    mine = _mine(tmp_path)
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)
    link = sticky / "cache"
    link.symlink_to(Path("..") / "mine")  # relative links resolve from the link's own directory
    monkeypatch.setenv(compilation_cache.VARIABLE, str(link))
    jax = _FakeJax()
    assert compilation_cache.enable(jax)
    given = jax.config.values["jax_compilation_cache_dir"]
    checked = mine / compilation_cache.cache_directory().name
    assert given == str(checked) == os.path.realpath(given) and checked.is_dir()
    planted = tmp_path / "planted"
    (planted / checked.name).mkdir(parents=True)
    link.unlink()
    link.symlink_to(planted)
    assert os.path.samefile(given, checked)  # the swap did not move what JAX was given
    # A sticky directory may be the cache's parent only: the cache's own directory is this user's, 0700.
    monkeypatch.setenv(compilation_cache.VARIABLE, str(sticky))
    assert compilation_cache.enable(jax) and (sticky / checked.name).stat().st_mode & 0o7777 == 0o700


@pytest.mark.process
def test_a_cache_directory_another_user_made_open_is_refused(monkeypatch, capsys, tmp_path, other_user):
    monkeypatch.setenv(compilation_cache.VARIABLE, str(tmp_path))
    directory = compilation_cache.cache_directory()
    directory.mkdir()
    directory.chmod(0o1777)
    os.chown(directory, other_user, other_user)
    assert not compilation_cache.enable(_FakeJax())
    assert f"{directory} is not a directory of this user's alone" in capsys.readouterr().err


def test_a_directory_swapped_while_jax_opens_it_is_not_used(monkeypatch, capsys, tmp_path):
    """The path is checked again after JAX opened its cache: a directory replaced between the check and
    JAX's open (here by the test, between them) turns the cache off, and what JAX opened is set aside."""
    monkeypatch.setenv(compilation_cache.VARIABLE, str(tmp_path / "cache"))
    directory = compilation_cache.cache_directory()
    opened = []

    class _Internals:
        def reset_cache(self):
            opened.append("reset")

        def _initialize_cache(self):
            directory.rename(tmp_path / "checked")
            directory.mkdir(mode=0o700)  # another directory at the checked path
            opened.append("open")

    jax = _FakeJax()
    jax._src = type("_Src", (), {"compilation_cache": _Internals()})()
    assert not compilation_cache.enable(jax)
    assert opened == ["reset", "open", "reset"]
    assert jax.config.values["jax_compilation_cache_dir"] is None
    assert capsys.readouterr().err == (
        f"reprocube: JAX compilation cache off: {directory} changed between its check and JAX opening it\n"
    )


_COMPILE_AFTER_A_SWAP = """
    import sys
    import jax
    from reprocube.runtime import compilation_cache
    print(compilation_cache.enable(jax), flush=True)
    sys.stdin.readline()  # the link is swapped meanwhile
    jax.jit(lambda x: x * 3 + 1)(jax.numpy.arange(4.0)).block_until_ready()
"""


@pytest.mark.process
@pytest.mark.parametrize("link_owner", ["me", "other"])
def test_jax_never_writes_where_a_swapped_link_points(tmp_path, other_user, link_owner):
    """The attack of issue 55 with JAX itself: a link to a directory of ours passes the check, then is
    pointed at another user's directory before JAX compiles. JAX used to write its executables there (and
    load the ones planted there). Another user's link is refused; ours is resolved before JAX gets it."""
    mine = _mine(tmp_path)
    link = tmp_path / "cache"
    link.symlink_to(mine)
    if link_owner == "other":
        os.lchown(link, other_user, other_user)
    name = compilation_cache.cache_directory().name  # the CPU's: the same in the child
    theirs = tmp_path / "theirs"
    (theirs / name).mkdir(parents=True, mode=0o700)  # planted, with the name the cache would have
    for directory in (theirs, theirs / name):
        os.chown(directory, other_user, other_user)
    env = {**os.environ, compilation_cache.VARIABLE: str(link), "JAX_PLATFORMS": "cpu"}
    process = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(_COMPILE_AFTER_A_SWAP)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        enabled = process.stdout.readline().strip()
        link.unlink()
        link.symlink_to(theirs)
        if link_owner == "other":
            os.lchown(link, other_user, other_user)
        _, err = process.communicate("go\n", timeout=120)
    finally:
        process.kill()
    assert process.returncode == 0, err
    assert not any((theirs / name).iterdir())  # nothing written where the swapped link points
    if link_owner == "other":
        assert enabled == "False"
        assert f"JAX compilation cache off: {link} belongs to another user (uid {other_user})" in err
        assert not any(mine.iterdir())
    else:
        assert enabled == "True" and any((mine / name).iterdir())  # JAX kept to the directory checked
