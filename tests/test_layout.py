"""The code's shape, in layers: the engine (everything but the upper packages) never imports orchestration,
check, pages, commands or the CLI; check (`reprocube check`'s room) sits on orchestration's child processes
and is imported by commands only, never by orchestration; orchestration (child processes, launchers, job apps) and the
pages never import commands or the CLI, nor each other; no command imports another; and no module
imports, directly or through others, a module that imports it back (imports inside functions included)."""

from __future__ import annotations

import ast
import inspect
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


UPPER = (
    "reprocube.orchestration",
    "reprocube.check",
    "reprocube.pages",
    "reprocube.commands",
    "reprocube.cli",
    "reprocube.__main__",
)


def _layer(module: str) -> str:
    return next((layer for layer in UPPER if module == layer or module.startswith(layer + ".")), "engine")


# What each layer may import besides the engine (and itself: modules within a package).
MAY_IMPORT = {
    "engine": set(),
    "reprocube.orchestration": set(),
    "reprocube.check": {"reprocube.orchestration"},  # its runs are child processes (orchestration.children)
    "reprocube.pages": set(),
    "reprocube.commands": {"reprocube.orchestration", "reprocube.check", "reprocube.pages"},
    "reprocube.cli": {"reprocube.commands", "reprocube.orchestration"},
    "reprocube.__main__": {"reprocube.cli"},
}


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    found = []
    for module, targets in graph.items():
        layer = _layer(module)
        for target in targets:
            other = _layer(target)
            if other in ("engine", layer) or other in MAY_IMPORT[layer]:
                if layer == other == "reprocube.commands" and target != "reprocube.commands":
                    found.append(f"{module} -> {target} (a command imports another)")
                continue
            found.append(f"{module} -> {target} ({layer} may not import {other})")
    return sorted(found)


def test_each_layer_imports_only_the_layers_below_it():
    assert not layer_violations(import_graph())


# Within the engine: packages that never import another. A result file is written from what the
# comparison engine found; the schema and its wording must not reach back into the engine that finds it.
NEVER_IMPORTS = {"reprocube.results": "reprocube.analysis"}


def engine_violations(graph: dict[str, set[str]]) -> list[str]:
    found = []
    for module, targets in graph.items():
        for lower, upper in NEVER_IMPORTS.items():
            if module == lower or module.startswith(lower + "."):
                found += [
                    f"{module} -> {t} ({lower} may not import {upper})"
                    for t in targets
                    if t == upper or t.startswith(upper + ".")
                ]
    return sorted(found)


def test_results_never_import_analysis():
    assert not engine_violations(import_graph())


def judged_violations(graph: dict[str, set[str]]) -> list[str]:
    """Engine modules outside reprocube.analysis that import it: training, data and the formats (a receipt,
    OPS.json, the tensor readers, the output files) sit below the engine that judges them (issue 57)."""
    analysis = "reprocube.analysis"
    return sorted(
        f"{module} -> {target} (only the upper layers may import {analysis})"
        for module, targets in graph.items()
        if _layer(module) == "engine" and not (module == analysis or module.startswith(analysis + "."))
        for target in targets
        if target == analysis or target.startswith(analysis + ".")
    )


def test_training_data_and_formats_never_import_the_engine_that_judges_them():
    assert not judged_violations(import_graph())


def test_the_judged_checker_sees_a_trainer_importing_analysis():
    """The imports as they stood before issue 57 (the loop ranking environment changes with the engine's
    module, a trainer taking OPS.json's marker from its reader) are found."""
    graph = import_graph()
    graph["reprocube.training.loop"] = graph["reprocube.training.loop"] | {"reprocube.analysis.receipt_comparison"}
    graph["reprocube.frameworks.jax"] = graph["reprocube.frameworks.jax"] | {
        "reprocube.analysis.first_differing_operation"
    }
    assert judged_violations(graph) == [
        "reprocube.frameworks.jax -> reprocube.analysis.first_differing_operation "
        "(only the upper layers may import reprocube.analysis)",
        "reprocube.training.loop -> reprocube.analysis.receipt_comparison (only the upper layers may import reprocube.analysis)",
    ]


def test_the_engine_checker_sees_results_importing_analysis():
    """The circle as it stood before issue 38 (compare.md's wording taken from analysis) is found."""
    graph = import_graph()
    graph["reprocube.results.compare_result"] |= {"reprocube.analysis.run_comparison"}
    assert engine_violations(graph) == [
        "reprocube.results.compare_result -> reprocube.analysis.run_comparison "
        "(reprocube.results may not import reprocube.analysis)"
    ]


def test_the_layer_checker_sees_an_upward_import_and_a_command_importing_another():
    graph = import_graph()
    graph["reprocube.formats.trace"] = graph["reprocube.formats.trace"] | {"reprocube.pages.html"}
    graph["reprocube.commands.report"] = graph["reprocube.commands.report"] | {"reprocube.commands.compare"}
    graph["reprocube.orchestration.children"] = graph["reprocube.orchestration.children"] | {"reprocube.pages.html"}
    found = "\n".join(layer_violations(graph))
    assert "reprocube.formats.trace -> reprocube.pages.html" in found
    assert "reprocube.commands.report -> reprocube.commands.compare (a command imports another)" in found
    assert "reprocube.orchestration.children -> reprocube.pages.html" in found


def test_commands_holds_commands_only():
    """Each module in commands/ is a command listed in reprocube.commands.COMMANDS, with HELP,
    add_arguments(parser) and run(args)."""
    import importlib

    from reprocube.commands import COMMANDS

    modules = {p.stem for p in (PACKAGE / "commands").glob("*.py") if p.stem != "__init__"}
    assert modules == set(COMMANDS)
    for info in COMMANDS.values():
        module = importlib.import_module(info.module)
        assert isinstance(module.HELP, str) and callable(module.add_arguments) and callable(module.run)
        assert list(inspect.signature(module.run).parameters) == ["args"], info.module


def test_the_checker_sees_a_cycle(tmp_path, monkeypatch):
    """The cycle test can fail: a two-module cycle planted in a copy of the graph is found."""
    graph = import_graph()
    graph["reprocube.training.state"] = graph["reprocube.training.state"] | {"reprocube.training.loop"}
    monkeypatch.setattr(__import__(__name__), "import_graph", lambda: graph)
    try:
        test_no_import_cycles()
    except AssertionError as exc:
        assert "reprocube.training.loop" in str(exc) and "reprocube.training.state" in str(exc)
    else:
        raise AssertionError("a planted cycle went unnoticed")


def manifest_key_lookups(source: str) -> list[str]:
    """`x.manifest["key"]`, `manifest.get("key")`, `read_manifest(p)["key"]`: a manifest key spelled as a
    literal (the Manifest in checkpoint.py names them)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        target, key = None, None
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            target, key = node.value, node.slice.value
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
            target = node.func.value
            key = node.args[0].value if node.args and isinstance(node.args[0], ast.Constant) else None
        text = ast.unparse(target) if target is not None else ""
        if isinstance(key, str) and ("manifest" in text.split(".")[-1] or text.startswith("read_manifest(")):
            found.append(f"{text}[{key!r}]")
    return found


def test_no_module_but_checkpoint_spells_a_manifest_key():
    found = {
        str(path.relative_to(PACKAGE)): manifest_key_lookups(path.read_text())
        for path in PACKAGE.rglob("*.py")
        if path.name != "checkpoint.py"
    }
    assert not {path: keys for path, keys in found.items() if keys}
    assert manifest_key_lookups('a = c.manifest["epoch"]; b = manifest.get("seed"); d = read_manifest(p)["x"]') == [
        "c.manifest['epoch']",
        "manifest['seed']",
        "read_manifest(p)['x']",
    ]
