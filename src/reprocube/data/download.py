"""`reprocube download`: fetch the four IDX files from the mirrors (or copy them from a local
directory), verify the pinned checksum of each decompressed payload, and store them atomically."""

from __future__ import annotations

import gzip
import http.client
import io
import os
import stat
import urllib.error
import urllib.request
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from omegaconf import DictConfig

from reprocube.data.idx import parse_idx
from reprocube.data.store import dataset_dir, read_verified
from reprocube.errors import DataError
from reprocube.files import CHUNK, fsync_dir, make_temp_file, sha256_file

TIMEOUT_S = 60
GZIP_MAGIC = b"\x1f\x8b"


def download_dataset(cfg: DictConfig, log: Callable[[str], None] = print) -> Path:
    """Make <data_dir>/<dataset> hold every file of the dataset, verified. Returns that directory."""
    target = dataset_dir(cfg)
    target.mkdir(parents=True, exist_ok=True)
    sources = _local_sources(cfg.data.source_dir) if cfg.data.source_dir else _mirror_sources(cfg.dataset.mirrors)
    for spec in cfg.dataset.files.values():
        final = target / spec.name
        if _already_verified(final, spec):
            log(f"{final}: present and verified")
            continue
        failures = []
        for describe, opener in sources(spec.name):
            try:
                _store_verified(opener, final, spec)
            except DataError as exc:
                failures.append(f"{describe}: {exc}")
                continue
            log(f"{final}: verified (from {describe})")
            break
        else:
            raise DataError(f"could not fetch {spec.name}: " + "; ".join(failures or ["dataset.mirrors is empty"]))
    return target


def _already_verified(path: Path, spec: DictConfig) -> bool:
    if not path.exists():
        return False
    try:
        read_verified(path, spec)
    except DataError:
        return False
    return True


def _mirror_sources(mirrors):
    def sources(name: str):
        for mirror in mirrors:
            url = mirror.rstrip("/") + "/" + name + ".gz"
            yield url, (lambda url=url: _open_url(url))

    return sources


def _local_sources(source_dir: str):
    directory = Path(source_dir)
    if not directory.is_dir():
        raise DataError(f"data.source_dir {directory} is not a directory")

    def sources(name: str):
        candidates = [p for p in (directory / (name + ".gz"), directory / name) if p.exists()]
        if not candidates:
            yield f"{directory}/{name}[.gz]", _missing
        for candidate in candidates:
            yield str(candidate), (lambda path=candidate: _open_local(path))

    return sources


def _open_local(path: Path) -> BinaryIO:
    """A local source file, only if it is a regular file (a FIFO or a device could block or never end)."""
    file = open(path, "rb", opener=lambda p, flags: os.open(p, flags | os.O_NONBLOCK))
    if not stat.S_ISREG(os.fstat(file.fileno()).st_mode):
        file.close()
        raise DataError("not a regular file")
    os.set_blocking(file.fileno(), True)
    return file


def _missing() -> BinaryIO:
    raise DataError("not found")


def _open_url(url: str) -> BinaryIO:
    try:
        return urllib.request.urlopen(url, timeout=TIMEOUT_S)  # http(s) mirrors from config
    except urllib.error.HTTPError as exc:
        raise DataError(f"HTTP {exc.code} {exc.reason}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise DataError(f"unreachable ({getattr(exc, 'reason', exc)})") from None


def _store_verified(opener: Callable[[], BinaryIO], final: Path, spec: DictConfig) -> None:
    """Stream, decompress and hash into a temp file beside `final`; rename only if it verifies."""
    fd, tmp = make_temp_file(final.parent, final.name)
    try:
        with os.fdopen(fd, "wb") as out:
            with opener() as raw:
                _copy_payload(raw, out, spec.bytes)
            out.flush()
            os.fsync(out.fileno())
        payload_digest = sha256_file(tmp)
        if payload_digest != spec.sha256:
            raise DataError(f"checksum mismatch: sha256 {payload_digest}, pinned {spec.sha256}")
        parse_idx(tmp.read_bytes(), spec.name)  # the pin already implies this; keeps custom pins honest
        os.replace(tmp, final)
        fsync_dir(final.parent)
    finally:
        tmp.unlink(missing_ok=True)


def _copy_payload(raw: BinaryIO, out: BinaryIO, expected_bytes: int) -> None:
    """Copy the payload (gunzipped when it is gzip), refusing more bytes than pinned. Reading errors
    are the source's fault (try the next one); writing errors (a full disk) are ours and propagate."""
    written = 0
    for chunk in _payload_chunks(raw):
        written += len(chunk)
        if written > expected_bytes:
            raise DataError(f"payload larger than the pinned {expected_bytes} bytes")
        out.write(chunk)
    if written != expected_bytes:
        raise DataError(f"payload is {written} bytes, pinned {expected_bytes}")


def _payload_chunks(raw: BinaryIO):
    try:
        stream = io.BufferedReader(raw)
        if stream.peek(2)[:2] == GZIP_MAGIC:
            stream = gzip.GzipFile(fileobj=stream)
        while chunk := stream.read(CHUNK):
            yield chunk
    except (OSError, EOFError, zlib.error, http.client.HTTPException) as exc:
        raise DataError(f"corrupt or truncated download ({exc})") from None
