"""The probe's traces (reprocube.probe) read back, strictly, for `reprocube check`; they are compared in
reprocube.analysis.probe_trace_comparison.

A trace is written by someone else's process: read through reprocube.untrusted (a regular file, bounded,
strict JSON lines), every record type-checked, and a malformed one is a CheckpointError naming the file
and line. Each attempt of a stopped run has its own file. An attempt's records carry the global step when
the script passed it; steps_of numbers the others from where the attempt began.

Several processes write one trace each (reprocube.probe: rank 0 at the attempt's path, rank r beside it
as `attempt-N.rank-r.jsonl`): read_rank_traces reads them all."""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from reprocube.errors import CheckpointError
from reprocube.probe_streams import MAX_LEARNING_RATES, MAX_STREAMS
from reprocube.untrusted import Fields, iter_json_lines

PROBE_VERSIONS = (1, 2, 3)  # 2: each update has "at", when it was recorded (CLOCK_MONOTONIC seconds); 3: "streams"
STREAM = re.compile(r"[0-9a-f]{16}\Z")  # a stream's digest (reprocube.probe_streams)
STREAM_NAME = re.compile(r"(torch|torch\.cuda:[0-9]{1,4}|numpy|python|batch|passed\.[^\x00-\x1f\x7f]{1,100})\Z")
MAX_TRACE_BYTES = 512 << 20  # about 5 million steps of an 8-tensor model
MAX_TENSORS = 100_000
LOSS_DTYPES = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8}
HEX = re.compile(r"^[0-9a-f]*\Z")
MAX_RANK = 65535
MAX_RANKS = 1024  # traces of one attempt read
MAX_RANK_TRACES_BYTES = 4 << 30  # all ranks' traces of one attempt together
MAX_DIRECTORY_ENTRIES = 100_000  # scanned for rank traces
RANK_NUMBER = re.compile(r"[1-9][0-9]{0,4}\Z", re.ASCII)  # a rank file's number: 1..65535, as written


@dataclass(frozen=True)
class Update:
    loss: str  # the loss's little-endian bits, hex
    loss_dtype: str
    fingerprints: tuple[int, ...]  # per tensor, in the header's name order
    # version 3: the digests of the streams that do not depend on the numbers (generators, the batch) by name,
    # and the learning rates where given; recorded, not (yet) part of what makes two updates the same
    streams: tuple[tuple[str, str], ...] = field(default=(), compare=False)
    lr: tuple[float, ...] | None = field(default=None, compare=False)


@dataclass
class AttemptTrace:
    path: Path
    names: list[str] = field(default_factory=list)
    updates: list[tuple[int | None, Update]] = field(default_factory=list)  # (the step the script gave, update)
    times: list[float | None] = field(default_factory=list)  # when each update was recorded (None: version 1)
    version: int = 2
    checkpoints: list[int] = field(default_factory=list)  # global steps announced, in order
    rank: int = 0  # the header's rank (0 where none is given: a single process)
    world_size: int | None = None
    resumed: int | None = None  # where the script said this attempt resumed (probe.resumed), if it did


def read_trace(path: Path, expect_sha256: str | None = None) -> AttemptTrace | None:
    """One attempt's trace; None where the script wrote none (no probe, or stopped before its first step).
    `expect_sha256`: the sha256 a receipt records of it, checked against the very bytes parsed."""
    if not path.exists() and not path.is_symlink():
        return None
    trace, where = AttemptTrace(path), str(path)
    last_given = 0
    digest = hashlib.sha256() if expect_sha256 is not None else None
    for number, value in iter_json_lines(path, CheckpointError, MAX_TRACE_BYTES, digest):
        fields = Fields(value, f"{where}:{number}", CheckpointError)
        if number == 1:
            _header(fields, trace)
        elif fields.has("resumed"):
            _keys(fields, ("resumed",))
            if trace.updates or trace.resumed is not None:
                raise CheckpointError(f"{fields.where}: resumed is said once, before the first update")
            trace.resumed = last_given = fields.integer("resumed", 0, 2**62)
        elif fields.has("names"):
            if trace.names:
                raise CheckpointError(f"{fields.where}: a second names record")
            _names(fields, trace)
        elif fields.has("checkpoint"):
            _keys(fields, ("checkpoint", "after_index"))
            fields.integer("after_index", len(trace.updates), len(trace.updates))  # the steps recorded before it
            trace.checkpoints.append(fields.integer("checkpoint", 0, 2**62))
        else:
            if not trace.names:
                raise CheckpointError(f"{fields.where}: an update before the names record")
            given, update, at = _update(fields, len(trace.updates) + 1, len(trace.names), trace.version)
            if given is not None:  # the script's own steps only increase (the probe refuses others)
                fields.integer("step", last_given + 1, 2**62)
                last_given = given
            trace.updates.append((given, update))
            trace.times.append(at)
    if digest is not None and digest.hexdigest() != expect_sha256:
        raise CheckpointError(f"{path}: its sha256 is not the one its receipt records (the trace was changed)")
    return trace


def rank_trace_path(path: Path, rank: int) -> Path:
    """Rank `rank`'s trace of the attempt whose trace is `path` (the probe's naming: rank 0 at `path`)."""
    return path if rank == 0 else path.with_name(f"{path.stem}.rank-{rank}{path.suffix}")


def read_rank_traces(path: Path) -> dict[int, AttemptTrace]:
    """Every rank's trace of one attempt, by rank ({} where no process wrote one): rank 0's at `path`,
    rank r's beside it (rank_trace_path). Only names of exactly that pattern are read (r written as
    1..65535, no leading zero); at most MAX_RANKS of them and MAX_RANK_TRACES_BYTES together, each read
    strictly, and the rank in each header must be the file's. A CheckpointError otherwise."""
    path = Path(path)
    traces: dict[int, AttemptTrace] = {}
    found = read_trace(path)
    if found is not None:
        if found.rank != 0:
            raise CheckpointError(f"{path}: rank 0's trace says rank {found.rank}")
        traces[0] = found
    directory = path.parent
    if directory.is_symlink() or not directory.is_dir():
        return traces
    prefix, suffix = f"{path.stem}.rank-", path.suffix
    ranks, total = [], 0
    with os.scandir(directory) as entries:
        for seen, entry in enumerate(entries, start=1):
            if seen > MAX_DIRECTORY_ENTRIES:
                raise CheckpointError(f"{directory}: more than {MAX_DIRECTORY_ENTRIES} entries (rank traces not read)")
            name = entry.name
            number = name[len(prefix) : len(name) - len(suffix)] if suffix else name[len(prefix) :]
            if not (name.startswith(prefix) and name.endswith(suffix) and RANK_NUMBER.match(number)):
                continue
            if int(number) > MAX_RANK:
                continue
            ranks.append(int(number))
            if len(ranks) > MAX_RANKS:
                raise CheckpointError(f"{directory}: more than {MAX_RANKS} rank traces of {path.name}")
            total += entry.stat(follow_symlinks=False).st_size
            if total > MAX_RANK_TRACES_BYTES:
                raise CheckpointError(
                    f"{directory}: the rank traces of {path.name} exceed {MAX_RANK_TRACES_BYTES} bytes"
                )
    for rank in sorted(ranks):
        trace = read_trace(rank_trace_path(path, rank))
        if trace is None:
            continue
        if trace.rank != rank:
            raise CheckpointError(f"{trace.path}: the trace of rank {rank} says rank {trace.rank}")
        traces[rank] = trace
    sizes = {t.world_size for t in traces.values() if t.world_size is not None}
    if len(sizes) > 1:
        raise CheckpointError(
            f"{path}: its ranks' traces give {len(sizes)} world sizes ({', '.join(map(str, sorted(sizes)))})"
        )
    return traces


def _header(fields: Fields, trace: AttemptTrace) -> None:
    """{"probe": 1 or 2}, and from a process with a rank variable "rank" and "world_size" (or null) too."""
    ranked = fields.has("rank") or fields.has("world_size")
    _keys(fields, ("probe", "rank", "world_size") if ranked else ("probe",))
    trace.version = fields.integer("probe", PROBE_VERSIONS[0], PROBE_VERSIONS[-1])
    if ranked:
        trace.world_size = fields.nullable("world_size", lambda key: fields.integer(key, 1, MAX_RANK + 1))
        trace.rank = fields.integer("rank", 0, (trace.world_size or MAX_RANK + 1) - 1)


def _names(fields: Fields, trace: AttemptTrace) -> None:
    _keys(fields, ("names",))
    trace.names = fields.texts("names")
    if not 0 < len(trace.names) <= MAX_TENSORS or len(set(trace.names)) != len(trace.names):
        raise CheckpointError(f"{fields.where}: names must be 1 to {MAX_TENSORS} distinct names")


def _update(fields: Fields, index: int, tensors: int, version: int) -> tuple[int | None, Update, float | None]:
    later = ("at",) if version == 2 else ("at", "streams") if version >= 3 else ()
    lr = version >= 3 and fields.has("lr")
    _keys(fields, ("index", "step", "loss", "loss_dtype", "fingerprints", *later, *(("lr",) if lr else ())))
    fields.integer("index", index, index)
    step = fields.nullable("step", lambda key: fields.integer(key, 1, 2**62))
    dtype = fields.one_of("loss_dtype", tuple(LOSS_DTYPES))
    loss = fields.text("loss")
    if len(loss) != 2 * LOSS_DTYPES[dtype] or not HEX.match(loss):
        raise CheckpointError(f"{fields.where}: loss must be {2 * LOSS_DTYPES[dtype]} lowercase hex digits (a {dtype})")
    prints = fields.present("fingerprints")
    if not (
        isinstance(prints, list)
        and len(prints) == tensors
        and all(isinstance(p, int) and not isinstance(p, bool) and 0 <= p < 2**32 for p in prints)
    ):
        raise CheckpointError(f"{fields.where}: fingerprints must be a list of {tensors} integers from 0 to 2**32-1")
    at = fields.number("at") if version >= 2 else None
    streams = _streams(fields) if version >= 3 else ()
    rates = tuple(fields.numbers("lr")) if lr else None
    if rates is not None and not 0 < len(rates) <= MAX_LEARNING_RATES:
        raise CheckpointError(f"{fields.where}: lr must be a list of 1 to {MAX_LEARNING_RATES} numbers")
    return step, Update(loss, dtype, tuple(prints), streams, rates), at


def _streams(fields: Fields) -> tuple[tuple[str, str], ...]:
    """{"torch": 16 hex digits, ...}: at most MAX_STREAMS known names (a passed generator's is the script's)."""
    streams = fields.mapping("streams")
    named = streams.value
    known = all(STREAM_NAME.match(k) and isinstance(v, str) and STREAM.match(v) for k, v in named.items())
    if len(named) > MAX_STREAMS or not known:
        raise CheckpointError(
            f"{fields.where}: streams must map at most {MAX_STREAMS} known names to 16 lowercase hex digits"
        )
    return tuple(sorted(named.items()))


def _keys(fields: Fields, keys: tuple[str, ...]) -> None:
    unknown = sorted(set(fields.value) - set(keys))
    if unknown:
        raise CheckpointError(f"{fields.where}: unknown key {unknown[0]!r}")
    for key in keys:
        fields.present(key)


def steps_of(trace: AttemptTrace, start: int) -> dict[int, Update]:
    """The attempt's updates by global step: the step the script gave, else one after the previous."""
    steps, step = {}, start
    for given, update in trace.updates:
        step = given if given is not None else step + 1
        steps[step] = update
    return steps


def step_times(trace: AttemptTrace, start: int) -> dict[int, float | None]:
    """When the attempt recorded each update, by global step as steps_of numbers them."""
    times, step = {}, start
    for (given, _), at in zip(trace.updates, trace.times, strict=True):
        step = given if given is not None else step + 1
        times[step] = at
    return times


def loss_value(update: Update) -> str:
    """The loss as a number, from its bits (a finite float prints exactly enough to tell two apart)."""
    import numpy as np

    dtype = np.float32 if update.loss_dtype == "bfloat16" else np.dtype(update.loss_dtype).newbyteorder("<")
    raw = bytes.fromhex(update.loss)
    if update.loss_dtype == "bfloat16":  # its bits are a float32's upper half
        raw = b"\x00\x00" + raw
    return repr(float(np.frombuffer(raw, dtype=dtype)[0]))
