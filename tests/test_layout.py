"""The code's shape: the engine never imports the commands layer or the CLI, and no module imports,
directly or through others, a module that imports it back (imports inside functions included)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "reprocube"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        imported = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module:
                imported |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
        # A package's own __init__ is not an edge: importing reprocube.x runs reprocube/__init__ anyway.
        graph[name] = {m for m in imported if m in modules and m != name and not name.startswith(m + ".")}
    return graph


def test_no_import_cycles():
    graph = import_graph()
    cycles = []

    def visit(module, path, done):
        for target in sorted(graph[module]):
            if target in path:
                cycles.append(path[path.index(target) :] + [target])
            elif target not in done:
                done.add(target)
                visit(target, path + [target], done)

    for module in sorted(graph):
        visit(module, [module], {module})
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles[:5])


def test_the_engine_never_imports_the_commands_or_the_cli():
    engine = {
        m: targets
        for m, targets in import_graph().items()
        if not m.startswith(("reprocube.commands", "reprocube.cli", "reprocube.__main__"))
    }
    offending = {
        m: sorted(t for t in targets if t.startswith(("reprocube.commands", "reprocube.cli")))
        for m, targets in engine.items()
    }
    assert not {m: t for m, t in offending.items() if t}


def test_the_checker_sees_a_cycle(tmp_path, monkeypatch):
    """The cycle test can fail: a two-module cycle planted in a copy of the graph is found."""
    graph = import_graph()
    graph["reprocube.state"] = graph["reprocube.state"] | {"reprocube.loop"}
    monkeypatch.setattr(__import__(__name__), "import_graph", lambda: graph)
    try:
        test_no_import_cycles()
    except AssertionError as exc:
        assert "reprocube.loop" in str(exc) and "reprocube.state" in str(exc)
    else:
        raise AssertionError("a planted cycle went unnoticed")
