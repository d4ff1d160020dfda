"""`reprocube diff A B`: two checkpoint files, or two directories of them, of any format a training script
saves (safetensors, .pt/.pth, .npz/.npy, Keras .h5, JSON, CSV, text): bytes first, then tensor by tensor
with ULP statistics, or key by key and line by line; no run directory needed. Exit 0 when every file is
bit-identical (or identical but for the fields --ignore FILE:KEY leaves out), 6 when one differs (a file
that cannot be read as its format included), 4 when nothing could be compared, 2 when --ignore leaves
nothing to compare."""

from __future__ import annotations

import fnmatch
import os
from pathlib import Path

from reprocube.analysis.outputs import beside_tensors, compare_files, compare_outputs, parse_ignore
from reprocube.errors import EXIT_CHECKPOINT, EXIT_DIFFERENT, EXIT_OK, ConfigError
from reprocube.formats.output_files import is_orbax
from reprocube.terminal import one_line

HELP = "two checkpoint files or directories of any common format, tensor by tensor: reprocube diff A B"


def add_arguments(parser) -> None:
    parser.add_argument("a", type=Path, help="a file or a directory")
    parser.add_argument("b", type=Path, help="a file or a directory (the same kind as A)")
    parser.add_argument(
        "--ignore",
        action="append",
        default=[],
        metavar="GLOB|FILE:KEY",
        help="files not compared, or a field inside a file (a dotted JSON/YAML key, a CSV column)",
    )


def run(args) -> int:
    a, b = args.a, args.b
    for path in (a, b):
        if not (path.is_file() or path.is_dir()) or path.is_symlink():
            raise ConfigError(f"{path}: not a regular file or directory")
    if a.is_dir() != b.is_dir():
        raise ConfigError(f"{a} and {b}: give two files or two directories")
    _, fields = parse_ignore(args.ignore)
    if a.is_file() or (is_orbax(a) and is_orbax(b)):  # an Orbax checkpoint is one output (its tensors)
        keys = [key for glob, key in fields if any(fnmatch.fnmatch(p.name, glob) for p in (a, b))]
        files = [{"path": a.name, **compare_files(a, b, True, keys)}]
        if a.is_dir():  # and the files the script saved in them beside the tensors
            files += [{**f, "path": f"{a.name}/{f['path']}"} for f in beside_tensors(a, b)]
    else:
        names = sorted(set(os.listdir(a)) | set(os.listdir(b)))
        comparison = compare_outputs(a, b, names, args.ignore)
        if comparison["all_ignored"]:
            raise ConfigError(f"--ignore leaves out every file of {a} and {b}: nothing would be compared")
        files = comparison["files"]
    differing = [f for f in files if not f["same"] and f.get("compared", True)]
    unread = [f for f in files if not f.get("compared", True)]
    for entry in [*differing, *unread]:
        print(one_line(f"{entry['path']}: {entry['detail']}"))
    for entry in files:
        if entry["same"] and entry.get("ignored_fields"):
            print(one_line(f"{entry['path']}: {entry['detail']}"))
    if differing:
        verdict = f"differs in {len(differing)} of {len(files)} files"
    elif unread:  # never "identical" for what was not read
        verdict = (
            f"{len(files) - len(unread)} of {len(files)} files compared, all identical; {len(unread)} not compared"
        )
    else:
        verdict = "identical"
    print(f"{a} vs {b}: {verdict}")
    if differing:
        return EXIT_DIFFERENT
    return EXIT_OK if len(unread) < len(files) else EXIT_CHECKPOINT
