"""Facts about the repository itself that no other test would notice."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# A line that git writes around a conflict it could not merge (the `=======` line alone is too common).
CONFLICT_MARKER = re.compile(rb"^(<<<<<<< |>>>>>>> |\|\|\|\|\|\|\| )", re.MULTILINE)


@pytest.mark.process
def test_no_tracked_file_holds_merge_conflict_markers():
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    found = []
    for name in tracked.decode().split("\0"):
        path = ROOT / name
        if name and path.is_file() and not path.is_symlink():
            for match in CONFLICT_MARKER.finditer(path.read_bytes()):
                line = path.read_bytes()[: match.start()].count(b"\n") + 1
                found.append(f"{name}:{line}")
    assert not found, f"unresolved merge-conflict markers at {', '.join(found[:10])}"


def test_the_marker_pattern_finds_a_conflict():
    conflict = b"a\n<<<<<<< HEAD\nb\n=======\nc\n>>>>>>> branch\n"
    assert len(CONFLICT_MARKER.findall(conflict)) == 2


def test_committed_results_name_no_path_of_the_machine_they_ran_on():
    """Benchmark results are committed: an absolute path (a venv, a temporary directory, a checkout) says
    where they ran, not what they measured."""
    machine_path = re.compile(rb"(?<![\w.])(/(?:work|tmp|root|home)/[^\"\s]*)")
    found = []
    for path in sorted((ROOT / "benchmarks").rglob("*.json")):
        found += [f"{path.relative_to(ROOT)}: {m.group(1).decode()}" for m in machine_path.finditer(path.read_bytes())]
    assert not found, found[:5]


def test_the_files_make_test_hands_out_first_exist():
    """conftest.LONGEST_FILES_FIRST orders the suite for pytest-xdist: a renamed file would silently fall
    back to its alphabetical place."""
    from conftest import LONGEST_FILES_FIRST

    tests = Path(__file__).parent
    found = {path.name for path in tests.rglob("test_*.py")}
    assert [name for name in LONGEST_FILES_FIRST if name not in found] == []
    assert len(set(LONGEST_FILES_FIRST)) == len(LONGEST_FILES_FIRST), "a file named twice: its first place wins"


def test_no_module_is_over_500_lines_and_no_function_of_check_over_60():
    """One responsibility per module: a module that grows past 500 lines holds two; check's functions are
    read as rules and steps, each at most 60 lines."""
    import ast

    package = ROOT / "src" / "reprocube"
    long_modules = [
        f"{p.relative_to(package)}: {n}"
        for p in sorted(package.rglob("*.py"))
        if (n := len(p.read_text().splitlines())) > 500
    ]
    assert not long_modules, long_modules
    long_functions = [
        f"{p.name}:{node.name}: {node.end_lineno - node.lineno + 1}"
        for p in sorted((package / "check").glob("*.py"))
        for node in ast.walk(ast.parse(p.read_text()))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno - node.lineno + 1 > 60
    ]
    assert not long_functions, long_functions
