"""`reprocube download`: fetch the four IDX files from the mirrors (or copy them from a local
directory), verify the pinned checksum of each decompressed payload, and store them atomically."""

from __future__ import annotations

import gzip
import http.client
import os
import urllib.error
import urllib.request
import zlib
from pathlib import Path
from typing import BinaryIO, Callable

from omegaconf import DictConfig

from reprocube.data.idx import parse_idx
from reprocube.data.store import dataset_dir, read_verified
from reprocube.errors import DataError
from reprocube.files import CHUNK, fsync_dir, make_temp_file, sha256_file

TIMEOUT_S = 60


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
            raise DataError(f"could not fetch {spec.name}: " + "; ".join(failures or ["no source configured"]))
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
        for candidate in (directory / (name + ".gz"), directory / name):
            if candidate.exists():
                yield str(candidate), (lambda path=candidate: open(path, "rb"))

    return sources


def _open_url(url: str) -> BinaryIO:
    try:
        return urllib.request.urlopen(url, timeout=TIMEOUT_S)  # noqa: S310 (http(s) mirrors from config)
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
    """Copy the payload (gunzipped when it is gzip), refusing more bytes than pinned."""
    head = raw.read(2)
    source = raw
    if head == b"\x1f\x8b":
        source = gzip.GzipFile(fileobj=_Prefixed(head, raw))
    else:
        out.write(head)
    written = len(head) if source is raw else 0
    try:
        while chunk := source.read(CHUNK):
            written += len(chunk)
            if written > expected_bytes:
                raise DataError(f"payload larger than the pinned {expected_bytes} bytes")
            out.write(chunk)
    except (OSError, EOFError, zlib.error, http.client.HTTPException) as exc:
        raise DataError(f"corrupt or truncated download ({exc})") from None
    if written != expected_bytes:
        raise DataError(f"payload is {written} bytes, pinned {expected_bytes}")


class _Prefixed:
    """A read-only stream that replays the bytes already read to sniff the gzip magic."""

    def __init__(self, prefix: bytes, rest: BinaryIO):
        self._prefix, self._rest = prefix, rest

    def read(self, size: int = -1) -> bytes:
        if self._prefix:
            data, self._prefix = self._prefix, b""
            if size < 0:
                return data + self._rest.read()
            return data + self._rest.read(max(size - len(data), 0))
        return self._rest.read(size)
