"""The downloader against a real HTTP server on 127.0.0.1, and the local-directory source."""

from __future__ import annotations

import gzip
import http.server
import socket
import threading
from functools import partial
from pathlib import Path

import pytest

from helpers import FILE_KEYS, GeneratedDataset, make_payloads, reprocube

pytestmark = pytest.mark.process  # every test here starts a process: not in make test-quick


@pytest.fixture(scope="module")
def payloads():
    return make_payloads(train=50, test=20, seed=7)


@pytest.fixture
def server(tmp_path):
    """Serves tmp_path/www over HTTP on 127.0.0.1; yields the base URL."""
    root = tmp_path / "www"
    root.mkdir()
    handler = partial(_QuietHandler, directory=str(root))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield root, f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def _dataset(tmp_path: Path, payloads) -> GeneratedDataset:
    return GeneratedDataset(tmp_path / "data", payloads)


def _files_left(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir()) if directory.exists() else []


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_download_falls_through_failing_mirrors_verifies_and_is_idempotent(tmp_path, server, payloads):
    root, url = server
    dataset = _dataset(tmp_path, payloads)
    dataset.write_gz(root / "good")
    mirrors = f"dataset.mirrors=[{url}/missing/,http://127.0.0.1:{_closed_port()}/,{url}/good/]"
    proc = reprocube("download", *dataset.overrides(), mirrors, cwd=tmp_path)
    for key, name in FILE_KEYS.items():
        assert (dataset.directory / name).read_bytes() == payloads[key]
    assert "verified (from http://127.0.0.1" in proc.stdout
    assert _files_left(dataset.directory) == sorted(FILE_KEYS.values())  # no temporaries
    again = reprocube("download", *dataset.overrides(), mirrors, cwd=tmp_path)
    assert again.stdout.count("present and verified") == 4


def test_checksum_mismatch_is_refused_and_leaves_nothing(tmp_path, server, payloads):
    root, url = server
    dataset = _dataset(tmp_path, payloads)
    labels = payloads["train_labels"]
    tampered = dict(payloads, train_labels=labels[:-1] + bytes([labels[-1] ^ 1]))
    _dataset(tmp_path, tampered).write_gz(root / "bad")
    proc = reprocube("download", *dataset.overrides(), f"dataset.mirrors=[{url}/bad/]", cwd=tmp_path, check=False)
    assert proc.returncode == 3
    assert "checksum mismatch" in proc.stderr and "train-labels-idx1-ubyte" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert "train-labels-idx1-ubyte" not in _files_left(dataset.directory)
    assert not [n for n in _files_left(dataset.directory) if n.endswith(".partial")]


def test_truncated_gzip_is_refused_and_leaves_nothing(tmp_path, server, payloads):
    root, url = server
    dataset = _dataset(tmp_path, payloads)
    (root / "cut").mkdir()
    for key, name in FILE_KEYS.items():
        compressed = gzip.compress(payloads[key])
        (root / "cut" / (name + ".gz")).write_bytes(compressed[: len(compressed) // 2])
    proc = reprocube("download", *dataset.overrides(), f"dataset.mirrors=[{url}/cut/]", cwd=tmp_path, check=False)
    assert proc.returncode == 3
    assert "corrupt or truncated download" in proc.stderr
    assert _files_left(dataset.directory) == []


def test_all_mirrors_failing_names_each_reason(tmp_path, server, payloads):
    _, url = server
    dataset = _dataset(tmp_path, payloads)
    closed = f"http://127.0.0.1:{_closed_port()}/"
    proc = reprocube(
        "download", *dataset.overrides(), f"dataset.mirrors=[{url}/nothing/,{closed}]", cwd=tmp_path, check=False
    )
    assert proc.returncode == 3
    assert proc.stderr.startswith("reprocube: error: could not fetch train-images-idx3-ubyte: ")
    assert f"{url}/nothing/train-images-idx3-ubyte.gz: HTTP 404" in proc.stderr
    assert f"{closed}train-images-idx3-ubyte.gz: unreachable" in proc.stderr


def test_a_source_dir_without_the_files_says_so(tmp_path, payloads):
    (tmp_path / "empty").mkdir()
    proc = reprocube(
        "download",
        *_dataset(tmp_path, payloads).overrides(),
        f"data.source_dir={tmp_path / 'empty'}",
        cwd=tmp_path,
        check=False,
    )
    assert proc.returncode == 3
    assert f"{tmp_path / 'empty'}/train-images-idx3-ubyte[.gz]: not found" in proc.stderr


def test_copy_from_a_local_directory(tmp_path, payloads):
    dataset = _dataset(tmp_path, payloads)
    source = tmp_path / "source"
    dataset.write_gz(source)
    reprocube("download", *dataset.overrides(), f"data.source_dir={source}", cwd=tmp_path)
    for key, name in FILE_KEYS.items():
        assert (dataset.directory / name).read_bytes() == payloads[key]


def test_gzipped_files_in_the_dataset_directory_are_named_with_the_command_that_fixes_them(tmp_path, payloads):
    """Copied .gz files (a GPU host's first failure): training names them and the command, which works."""
    dataset = _dataset(tmp_path, payloads)
    dataset.write_gz(dataset.directory)
    proc = reprocube("train", *dataset.overrides(), "epochs=1", cwd=tmp_path, check=False)
    assert proc.returncode == 3, proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    assert "train-images-idx3-ubyte.gz is there" in line and "data.source_dir=" in line, line
    reprocube("download", *dataset.overrides(), f"data.source_dir={dataset.directory}", cwd=tmp_path)
    for key, name in FILE_KEYS.items():
        assert (dataset.directory / name).read_bytes() == payloads[key]


def test_a_stored_file_that_changed_is_refused_at_training_time(tmp_path, payloads):
    dataset = _dataset(tmp_path, payloads)
    dataset.directory.mkdir(parents=True)
    for key, name in FILE_KEYS.items():
        (dataset.directory / name).write_bytes(payloads[key])
    path = dataset.directory / FILE_KEYS["test_labels"]
    stored = path.read_bytes()
    path.write_bytes(stored[:-1] + bytes([stored[-1] ^ 1]))
    proc = reprocube("train", *dataset.overrides(), "epochs=1", cwd=tmp_path, check=False)
    assert proc.returncode == 3
    assert "does not match the pinned" in proc.stderr
    assert not (tmp_path / "runs" / "pytorch-seed0" / "checkpoints").exists()


def test_debian_fashion_mnist_matches_the_pins(tmp_path):
    source = Path("/usr/share/datasets/fashion-mnist")
    if not source.is_dir():
        pytest.fail("Debian's dataset-fashion-mnist is not installed (apt-get install dataset-fashion-mnist)")
    reprocube("download", "dataset=fashion_mnist", f"data_dir={tmp_path}", f"data.source_dir={source}", cwd=tmp_path)
    assert len(_files_left(tmp_path / "fashion_mnist")) == 4
