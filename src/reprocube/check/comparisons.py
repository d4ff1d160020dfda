"""What check makes of an output comparison (analysis.outputs.compare_outputs) before the verdict sees it:
the first difference and how the same outputs are the same, in words; a file whose every value is the same
under a strict reader but whose bytes differ (a layout difference: pickle's memo, zip member order) counted
the same; and whether two runs differ only in the directories check gives each run (its work directory,
HOME and TMPDIR), which a script that records where it ran writes into its outputs."""

from __future__ import annotations

from reprocube.check.runs import Run
from reprocube.errors import CheckpointError
from reprocube.results.check_result import same_but_for_fields
from reprocube.terminal import counted
from reprocube.untrusted import read_bytes

MAX_LOOKED_AT_BYTES = 64 << 20  # a differing output read again to look for the runs' own directories
OWN_DIRECTORIES = ("HOME", "TMPDIR")


def first_difference_words(comparison: dict) -> str:
    if comparison["missing"]:
        return f"{comparison['missing'][0]} was written by neither run"
    differing = [f for f in comparison["files"] if not f["same"] and f.get("compared", True)]
    if not differing:
        return "no declared output was written"
    first = next((f for f in differing if f.get("tensor")), differing[0])  # the weights first, then the rest
    others = len(differing) - 1
    return f"{first['path']} differs: {first['detail']}" + (f" (and {counted(others, 'other file')})" if others else "")


def identical_words(comparison: dict) -> str:
    """How the outputs a comparison found the same are the same: bit for bit; but for what --ignore FILE:KEY
    (or a Keras archive's save date) left out of a file whose bytes differ; or in every value, laid out in
    other bytes."""
    layout = [f["path"] for f in comparison["files"] if same_but_for_fields(f) and f.get("layout")]
    fields = [f["path"] for f in comparison["files"] if same_but_for_fields(f) and not f.get("layout")]
    if not fields and not layout:
        return "bit-identical to an uninterrupted run's"
    said = []
    if fields:
        said.append(f"bit for bit but {_few(fields)}: the same but for the fields left out, other bytes")
    if layout:
        said.append(
            f"{'and ' if fields else 'bit for bit but '}{_few(layout)}: every value bit-identical under a strict "
            "reader, laid out in other bytes (a layout difference, not a resume difference)"
        )
    return f"identical to an uninterrupted run's ({'; '.join(said)})"


def layout_as_same(comparison: dict) -> dict:
    """The comparison with each file that differs in layout only counted the same (its two sha256s stay,
    and say that the bytes differ)."""
    files = [{**f, "same": True} if f.get("layout") else f for f in comparison["files"]]
    compared = [f for f in files if f.get("compared", True)]
    first = next((f for f in compared if not f["same"]), None)
    return {
        **comparison,
        "files": files,
        "first": first,
        "identical": bool(compared) and first is None and not comparison["missing"],
    }


def own_value_difference(a: Run, b: Run, comparison: dict, outputs: list[str]) -> str | None:
    """Where every differing output of two runs is the same once each run's own work directory, HOME and
    TMPDIR (absolute paths check chose) are taken out of its bytes: those directories, in words; else None."""
    differing = [f for f in comparison["files"] if not f["same"] and f.get("compared", True)]
    if not differing or comparison["missing"]:
        return None
    seen: set[str] = set()
    for entry in differing:
        try:
            data_a = read_bytes(a.work / entry["path"], MAX_LOOKED_AT_BYTES, CheckpointError)
            data_b = read_bytes(b.work / entry["path"], MAX_LOOKED_AT_BYTES, CheckpointError)
        except (CheckpointError, OSError):
            return None
        same_without, found = _without_own(data_a, a) == _without_own(data_b, b), _own_in(data_a, a)
        if not same_without or not found:
            return None
        seen |= found
    return f"the {' and '.join(sorted(seen))} check gives each run ({', '.join(f['path'] for f in differing[:3])})"


def _own(run: Run) -> dict[str, bytes]:
    """The run's own directories as the bytes a script would write, the longest first (TMPDIR may lie
    under HOME's parent; a path never holds another's whole)."""
    own = {"work directory": str(run.work.absolute()).encode()}
    own |= {name: run.env[name].encode() for name in OWN_DIRECTORIES if run.env.get(name)}
    return dict(sorted(own.items(), key=lambda item: -len(item[1])))


def _own_in(data: bytes, run: Run) -> set[str]:
    return {name for name, path in _own(run).items() if path in data}


def _without_own(data: bytes, run: Run) -> bytes:
    for name, path in _own(run).items():
        data = data.replace(path, b"\0" + name.encode() + b"\0")
    return data


def _few(paths: list[str]) -> str:
    return f"{', '.join(paths[:3])}{' and more' if len(paths) > 3 else ''}"
