"""Structured text outputs (JSON, JSON lines, YAML, CSV and TSV) compared value by value for
reprocube.analysis.outputs: where two values first differ, named by key path, and the comparison with
`--ignore FILE:KEY` fields left out (a dotted key path, or a header's column), YAML as written."""

from __future__ import annotations

import csv
import io

import yaml

from reprocube.errors import CheckpointError
from reprocube.terminal import one_line
from reprocube.untrusted import compose_yaml, parse_json

MAX_FIELD_FILE_BYTES = 256 << 20  # a JSON, YAML or CSV file read whole to leave a field out


def fields_difference(suffix: str | None, a: bytes, b: bytes, keys: list[str], name: str) -> dict:
    """Two text files compared with `keys` left out: JSON, JSON lines and YAML by a dotted key path, CSV
    and TSV by a header column; "ignored_fields" records the keys, and which of them neither file held.
    What else must be equal:
    - JSON and JSON lines: every other value as parsed (strictly: duplicate keys refused), exactly (repr:
      types, float bits and key order); so layout, number spellings of one float (5e-1, 0.50) and string
      escapes are not compared, nor blank lines between JSON lines;
    - YAML: every other key and value as written (read_yaml_as_written: each scalar's text with its tag
      and quotes, in order; duplicate keys refused), since YAML 1.1 reads different texts as one value
      (yes and true, 0x10 and 16); only comments and layout are not compared;
    - CSV and TSV: every other cell as parsed, row by row; so quoting and line endings (CRLF) are not."""
    if suffix not in (".json", ".jsonl", ".yaml", ".yml", ".csv", ".tsv"):
        raise CheckpointError(f"{name}: FILE:KEY ignores apply to JSON, YAML and CSV files only")
    if max(len(a), len(b)) > MAX_FIELD_FILE_BYTES:
        raise CheckpointError(f"{name}: larger than the {MAX_FIELD_FILE_BYTES} bytes read to leave a field out")
    # Where each file held an ignored field: (record, key, its place); a field is left out only where both
    # files hold it at one place (one held only in A is a difference, never hidden: round 10).
    found_a: set[tuple[int, str, int]] = set()
    found_b: set[tuple[int, str, int]] = set()
    if suffix in (".yaml", ".yml"):
        va, vb = (_yaml_without(x, keys, f, f"{name} ({s})") for x, f, s in ((a, found_a, "A"), (b, found_b, "B")))
    elif suffix in (".csv", ".tsv"):
        va, vb = (
            _rows_without(x, keys, f, suffix, f"{name} ({s})") for x, f, s in ((a, found_a, "A"), (b, found_b, "B"))
        )
    else:
        va, vb = (
            _values_without(x, keys, f, suffix, f"{name} ({s})") for x, f, s in ((a, found_a, "A"), (b, found_b, "B"))
        )
    absent = [k for k in keys if not any(k == key for _, key, _ in found_a | found_b)]
    recorded = {"ignored_fields": keys, **({"ignored_absent": absent} if absent else {})}
    one_side = sorted(found_a ^ found_b)
    if one_side:
        record, key, _ = one_side[0]
        held = "A" if one_side[0] in found_a else "B"
        at = f" (record {record + 1})" if suffix == ".jsonl" else ""
        return {
            "same": False,
            "detail": f"the ignored {key}{at} is in {held} only, or at another place: left out only where both "
            "files hold it alike",
            **recorded,
        }
    if suffix in (".yaml", ".yml"):
        if va == vb:
            return {"same": True, "detail": f"identical but for the ignored {', '.join(keys)}", **recorded}
        return {"same": False, **_first_written(va, vb), **recorded}
    if repr(va) == repr(vb):
        return {"same": True, "detail": f"identical but for the ignored {', '.join(keys)}", **recorded}
    if suffix in (".csv", ".tsv"):
        for number, (x, y) in enumerate(zip(va, vb, strict=False), start=1):
            if x != y:
                return {
                    "same": False,
                    "detail": f"row {number}: {str(x)[:80]} vs {str(y)[:80]}",
                    "line": number,
                    **recorded,
                }
        return {"same": False, "detail": f"{len(va)} vs {len(vb)} rows", "line": min(len(va), len(vb)) + 1, **recorded}
    return {"same": False, **first_key(va, vb), **recorded}


def _values_without(data: bytes, keys: list[str], found: set[tuple[int, str, int]], suffix: str, where: str):
    if suffix == ".json":
        values = [parse_json(data, where, CheckpointError)]
    elif suffix == ".jsonl":
        lines = [line for line in data.split(b"\n") if line.strip()]
        values = [parse_json(line, f"{where}:{i}", CheckpointError) for i, line in enumerate(lines, start=1)]
    else:
        raise AssertionError(suffix)
    for record, value in enumerate(values):
        for key in keys:
            place = _drop(value, key.split("."))
            if place is not None:
                found.add((record, key, place))
    return values if suffix == ".jsonl" else values[0]


def _yaml_without(data: bytes, keys: list[str], found: set[tuple[int, str, int]], where: str):
    value = read_yaml_as_written(data, where)
    for key in keys:
        place = _drop_written(value, key.split("."))
        if place is not None:
            found.add((0, key, place))
    return value


def read_yaml_as_written(data: bytes, where: str):
    """A YAML document as written, for comparing: a scalar as its text in the file (its tag, quotes and
    spelling: `yes`, `true` and `"true"` all differ); a sequence as ("seq", tag, [items]); a mapping as
    ("map", tag, [[name, key as written, value], ...]) in the file's order, `name` the key's string
    (None for a key that is not a string) for naming and leaving it out. The document is read as
    parse_yaml reads it first (duplicate keys, aliases, deep nesting refused)."""
    node, text = compose_yaml(data, where, CheckpointError)

    def written(node):
        if isinstance(node, yaml.ScalarNode):
            return text[node.start_mark.index : node.end_mark.index]
        if isinstance(node, yaml.SequenceNode):
            return ("seq", node.tag, [written(item) for item in node.value])
        pairs = []
        for key, value in node.value:
            named = isinstance(key, yaml.ScalarNode) and key.tag == "tag:yaml.org,2002:str"
            pairs.append([key.value if named else None, written(key), written(value)])
        return ("map", node.tag, pairs)

    return None if node is None else written(node)


def _drop_written(value, parts: list[str]) -> int | None:
    """_drop for read_yaml_as_written's values: the pair of the mapping key named by the dotted path
    removed, a sequence item replaced by "<ignored>"; its place, None where it was not there."""
    for number, part in enumerate(parts):
        if not isinstance(value, tuple):
            return False
        items = value[2]
        if value[0] == "map":
            place = next((i for i, pair in enumerate(items) if pair[0] == part), None)
        else:
            place = int(part) if part.isdigit() and int(part) < len(items) else None
        if place is None:
            return False
        if number == len(parts) - 1:
            if value[0] == "map":
                del items[place]
            else:
                items[place] = "<ignored>"
            return place
        value = items[place][2] if value[0] == "map" else items[place]
    return None


def _first_written(a, b, path: str = "") -> dict:
    """Where two of read_yaml_as_written's values first differ, named by key path."""
    where = path or "<top>"
    if not (isinstance(a, tuple) and isinstance(b, tuple) and a[:2] == b[:2]):
        return {
            "detail": f"first differing value at {where}: {_written_text(a)} vs {_written_text(b)} (as written)",
            "key": path,
        }
    for index, (x, y) in enumerate(zip(a[2], b[2], strict=False)):
        if a[0] == "seq":
            if x != y:
                return _first_written(x, y, f"{path}.{index}" if path else str(index))
            continue
        if x[1] != y[1]:
            return {
                "detail": f"{where}: key {index + 1} is {_written_text(x[1])} vs {_written_text(y[1])}",
                "key": path,
            }
        if x[2] != y[2]:
            name = x[0] if x[0] is not None else _written_text(x[1])
            return _first_written(x[2], y[2], f"{path}.{name}" if path else name)
    unit = "items" if a[0] == "seq" else "keys"
    return {"detail": f"{where}: {len(a[2])} vs {len(b[2])} {unit}", "key": path}


def _written_text(value) -> str:
    if isinstance(value, str):
        return one_line(value)[:60]
    return {"seq": "a sequence", "map": "a mapping"}.get(value[0], "?") if isinstance(value, tuple) else "nothing"


def _drop(value, parts: list[str]) -> int | None:
    """Remove the dotted key path from `value` (a list index by its digits: replaced, so that the items
    after it keep their places); its place among its siblings, None where it was not there."""
    for part in parts[:-1]:
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            return None
    last = parts[-1]
    if isinstance(value, dict) and last in value:
        place = list(value).index(last)
        del value[last]
        return place
    if isinstance(value, list) and last.isdigit() and int(last) < len(value):
        value[int(last)] = "<ignored>"
        return int(last)
    return None


def _rows_without(
    data: bytes, columns: list[str], found: set[tuple[int, str, int]], suffix: str, where: str
) -> list[list[str]]:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise CheckpointError(f"{where} is not UTF-8 text") from None
    try:
        rows = list(csv.reader(io.StringIO(text, newline=""), delimiter="\t" if suffix == ".tsv" else ","))
    except csv.Error as exc:
        raise CheckpointError(f"{where}: not CSV ({exc})") from None
    header = rows[0] if rows else []
    dropped = {i for i, column in enumerate(header) if column in columns}
    found.update((0, header[i], i) for i in dropped)
    return [[cell for i, cell in enumerate(row) if i not in dropped] for row in rows]


def first_key(a, b, path: str = "") -> dict:
    if type(a) is not type(b) or not isinstance(a, dict | list):
        return {"detail": f"first differing value at {path or '<top>'}: {str(a)[:60]} vs {str(b)[:60]}", "key": path}
    keys = sorted(set(a) | set(b)) if isinstance(a, dict) else range(max(len(a), len(b)))
    for key in keys:
        inner = f"{path}.{key}" if path else str(key)
        if isinstance(a, dict) and (key not in a or key not in b):
            return {"detail": f"key {inner} only in {'A' if key in a else 'B'}", "key": inner}
        if isinstance(a, list) and (key >= len(a) or key >= len(b)):
            return {"detail": f"{path or '<top>'}: {len(a)} vs {len(b)} items", "key": inner}
        if a[key] != b[key]:
            return first_key(a[key], b[key], inner)
    return {"detail": "the bytes differ, the values are equal (formatting)", "key": None}
