"""Writes that name their target when they fail, and never go through a symbolic link."""

from __future__ import annotations

import errno

import pytest

from reprocube import files
from reprocube.files import append_line, write_file_atomic


def test_a_failed_atomic_write_names_the_target_not_its_temporary(tmp_path, monkeypatch):
    def full_disk(directory, final_name):
        raise OSError(errno.ENOSPC, "No space left on device", str(directory / f".{final_name}.x.partial"))

    monkeypatch.setattr(files, "make_temp_file", full_disk)
    with pytest.raises(OSError) as raised:
        write_file_atomic(tmp_path / "metrics.jsonl", b"x")
    assert raised.value.filename == str(tmp_path / "metrics.jsonl") and raised.value.errno == errno.ENOSPC


def test_an_atomic_write_replaces_a_link_not_its_target(tmp_path):
    target = tmp_path / "elsewhere.txt"
    target.write_text("keep me")
    (tmp_path / "config.yaml").symlink_to(target)
    write_file_atomic(tmp_path / "config.yaml", b"ours")
    assert target.read_text() == "keep me" and not (tmp_path / "config.yaml").is_symlink()
    assert (tmp_path / "config.yaml").read_text() == "ours"


def test_an_append_never_follows_a_link(tmp_path):
    target = tmp_path / "elsewhere.txt"
    target.write_text("keep me")
    (tmp_path / "sessions.jsonl").symlink_to(target)
    with pytest.raises(OSError, match="symbolic link"):
        append_line(tmp_path / "sessions.jsonl", "{}")
    assert target.read_text() == "keep me"
    append_line(tmp_path / "metrics.jsonl", "{}")
    append_line(tmp_path / "metrics.jsonl", "{}")
    assert (tmp_path / "metrics.jsonl").read_text() == "{}\n{}\n"


def test_sha256_regular_hashes_a_regular_file_and_nothing_else(tmp_path):
    import hashlib
    import os

    from reprocube.files import sha256_regular

    data = os.urandom(3 * files.CHUNK // 2)  # more than one read
    (tmp_path / "data.bin").write_bytes(data)
    assert sha256_regular(tmp_path / "data.bin") == hashlib.sha256(data).hexdigest()
    (tmp_path / "link").symlink_to(tmp_path / "data.bin")
    os.mkfifo(tmp_path / "fifo")  # opened without waiting for a writer
    for path in ("link", "fifo", "missing", "."):
        assert sha256_regular(tmp_path / path) is None, path
