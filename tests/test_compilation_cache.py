"""reprocube's JAX compilation cache (on by default): a run that loads its compiled steps from the cache
is bit-identical to one that compiled them, `off` compiles anew, and only a directory of this user is used."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from reprocube import compilation_cache

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
    off; our own directory left open is closed to 0700 and used."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    monkeypatch.setenv(compilation_cache.VARIABLE, str(shared / "cache"))
    jax = _FakeJax()
    assert not compilation_cache.enable(jax)
    assert f"{shared} could be changed by another user" in capsys.readouterr().err
    shared.chmod(0o755)
    directory = compilation_cache.cache_directory()
    directory.chmod(0o777)
    assert compilation_cache.enable(jax) and directory.stat().st_mode & 0o777 == 0o700
    assert jax.config.values["jax_persistent_cache_enable_xla_caches"] == "none"


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
