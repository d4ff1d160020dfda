"""Docs that cannot drift: README.md and docs/*.md against the code they describe.

- the configuration table (docs/configuration.md) names every key of the composed config, and only keys;
- every command-line option of every command is documented, and every option the docs give a reprocube
  command exists for that command;
- the exit statuses table (README.md) is the EXIT_* constants of reprocube.errors, both ways;
- the lists of place keys (reproduce) and non-result keys (resume) are the code's;
- the code map (docs/design.md) lists every module;
- every relative link points to an existing file (and heading).

Fast: nothing is trained, nothing runs in a child process."""

from __future__ import annotations

import argparse
import functools
import re
from pathlib import Path

from reprocube import errors
from reprocube.cli import _parser
from reprocube.commands import COMMANDS
from reprocube.config import NON_RESULT_KEYS, flatten_keys, load_config, to_plain
from reprocube.orchestration.reproduce_inputs import PLACE_KEYS

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "reprocube"
README = ROOT / "README.md"
DOCS = ROOT / "docs"
CONFIGURATION = DOCS / "configuration.md"
# Every page whose links are checked; the options and keys are looked for in README.md and docs/ only.
PAGES = [README, *sorted(DOCS.glob("*.md")), ROOT / "benchmarks" / "README.md"]

BACKTICKED = re.compile(r"`([^`\n]+)`")
OPTION = re.compile(r"(?<![\w=-])(--[a-z][a-z0-9-]*)")  # not a value (--slurm-option=--partition=gpu)
LINK = re.compile(r"\[[^\]\n]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^\s*```")

# Sections of the config documented by one `SECTION.*` row instead of a row per key:
WILDCARD_SECTIONS = {
    # A dataset's pinned file table (four files, each with name, bytes and sha256): data that the dataset
    # group fixes, not settings; the row says what each file entry holds.
    "dataset.files": "the dataset's four pinned files",
    # The same keys, defaults and meaning as study.slurm, which are documented one by one (asserted below).
    "verify.slurm": "as study.slurm",
}


def _text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def _doc_pages() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


@functools.cache
def composed_keys() -> frozenset[str]:
    """Every key of the composed config, over every option of each config group (framework.inter_op_threads
    exists only with framework=tensorflow, framework.prng_impl only with jax)."""
    keys = set()
    for overrides in ([], ["framework=tensorflow"], ["framework=jax"], ["dataset=mnist"]):
        keys |= set(flatten_keys(to_plain(load_config(overrides))))
    return frozenset(keys)


def _sections(keys) -> set[str]:
    """Every proper prefix of a key: `framework`, `dataset`, `verify.slurm`, ..."""
    return {".".join(key.split(".")[:n]) for key in keys for n in range(1, key.count(".") + 1)}


def table_rows(text: str, header: str) -> list[list[str]]:
    """The cells of the Markdown table whose header row is `header` (separator row skipped)."""
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if line.strip() == header]
    assert len(starts) == 1, f"expected one table with the header {header!r}, found {len(starts)}"
    rows = []
    for line in lines[starts[0] + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows


def documented_config_names() -> list[str]:
    """The backticked names in the key column of docs/configuration.md's table."""
    rows = table_rows(_text(CONFIGURATION), "| key | default | meaning |")
    names = [name for row in rows for name in BACKTICKED.findall(row[0])]
    assert len(rows) > 30 and names, "the configuration table was not found or is nearly empty"
    return names


def test_every_key_the_configuration_table_names_exists():
    keys = composed_keys()
    sections = _sections(keys)
    unknown = []
    for name in documented_config_names():
        bare = name.removesuffix(".*")
        if name.endswith(".*"):
            ok = bare in sections
        else:
            ok = bare in keys or bare in sections  # a key, or a config group such as `framework`
        if not ok:
            unknown.append(name)
    assert not unknown, f"docs/configuration.md names keys the config does not have: {unknown}"


def test_every_key_of_the_config_is_in_the_configuration_table():
    names = set(documented_config_names())
    missing = []
    for key in sorted(composed_keys()):
        wildcard = next((s for s in WILDCARD_SECTIONS if key.startswith(s + ".")), None)
        if key in names or (wildcard is not None and f"{wildcard}.*" in names):
            continue
        missing.append(key)
    assert not missing, f"keys missing from docs/configuration.md's table: {missing}"


def test_verify_slurm_has_the_keys_of_study_slurm_it_is_documented_by():
    keys = composed_keys()
    tails = {
        section: {k.removeprefix(section + ".") for k in keys if k.startswith(section + ".")}
        for section in ("verify.slurm", "study.slurm")
    }
    assert tails["verify.slurm"] == tails["study.slurm"]


def cli_options() -> dict[str, set[str]]:
    """Each command's option strings (--help aside), from the parser itself."""
    options = {}
    for name in COMMANDS:  # each command's options come from its own module, added when it is chosen
        subparsers = next(a for a in _parser(name)._actions if isinstance(a, argparse._SubParsersAction))
        sub = subparsers.choices[name]
        options[name] = {o for action in sub._actions for o in action.option_strings if o not in ("-h", "--help")}
    return options


def test_every_command_and_option_is_documented():
    text = "\n".join(_text(page) for page in _doc_pages())
    options = cli_options()
    assert {"train", "reproduce", "sign"} <= set(options)
    undocumented_commands = [c for c in options if not re.search(rf"\breprocube {c}\b", text)]
    undocumented = sorted(
        {o for opts in options.values() for o in opts if not re.search(rf"(?<![\w-]){o}(?![\w-])", text)}
    )
    assert not undocumented_commands, f"commands README.md and docs/ never show: {undocumented_commands}"
    assert not undocumented, f"options README.md and docs/ never mention: {undocumented}"


def reprocube_command_lines(text: str) -> list[str]:
    """Every command line the text gives for reprocube: code-block lines that start with `reprocube `
    (continued with a trailing backslash, comments cut off), and code spans that start with `reprocube `
    or with a command's name followed by an option (`reproduce --match`)."""
    commands = "|".join(cli_options())
    found, block, in_fence = [], [], False
    lines = text.splitlines()
    for index, line in enumerate(lines):
        if FENCE.match(line):
            in_fence = not in_fence
            continue
        if in_fence:
            block.append((index, line))
    skip = set()
    for position, (index, line) in enumerate(block):
        if index in skip or not line.lstrip().startswith("reprocube "):
            continue
        command = line.strip()
        following = position
        while command.endswith("\\") and following + 1 < len(block):
            following += 1
            skip.add(block[following][0])
            command = command[:-1] + " " + block[following][1].strip()
        found.append(re.sub(r"\s#.*$", "", command))
    for span in BACKTICKED.findall(text):
        if span.startswith("reprocube ") or re.match(rf"({commands}) --", span):
            found.append(span)
    return found


def test_every_option_the_docs_give_a_command_exists():
    options = cli_options()
    wrong, checked = [], 0
    for page in _doc_pages():
        for line in reprocube_command_lines(_text(page)):
            words = line.removeprefix("reprocube ").split()
            command = words[0] if words else ""
            if command not in options:
                wrong.append(f"{page.name}: {line!r}: no command {command!r}")
                continue
            for option in OPTION.findall(line.split(" -- ")[0]):  # after ` -- `: the user's own command
                checked += 1
                if option.split("=")[0] not in options[command]:
                    wrong.append(f"{page.name}: {line!r}: {command} has no {option}")
    assert checked > 10, "no reprocube command line with options was found in the docs"
    assert not wrong, "\n".join(wrong)


def test_the_exit_statuses_table_is_the_code_s():
    rows = table_rows(_text(README), "| status | meaning |")
    documented = [int(row[0]) for row in rows]
    constants = {value for name, value in vars(errors).items() if name.startswith("EXIT_")}
    assert len(documented) == len(set(documented)), f"a status is listed twice: {documented}"
    assert set(documented) == constants, (
        f"README's exit statuses {sorted(documented)} are not reprocube.errors' EXIT_* {sorted(constants)}"
    )
    assert all(row[1] for row in rows), "an exit status without its meaning"


def _listed(path: Path, phrase: str) -> list[set[str]]:
    """The backticked names in each `PHRASE (...)` of a page (line breaks ignored)."""
    text = " ".join(_text(path).split())
    return [set(BACKTICKED.findall(group)) for group in re.findall(re.escape(phrase) + r" \(([^)]*)\)", text)]


def test_the_place_keys_reproduce_accepts_are_the_code_s():
    for page in (README, DOCS / "reproduce.md"):
        lists = _listed(page, "only place keys")
        assert lists, f"{page.name} does not list the place keys (`only place keys (...)`)"
        for names in lists:
            assert names == set(PLACE_KEYS), f"{page.name}: place keys {sorted(names)}, code {sorted(PLACE_KEYS)}"


def test_the_non_result_keys_are_the_code_s():
    lists = _listed(CONFIGURATION, "non-result keys")
    assert len(lists) == 1, "docs/configuration.md must list the non-result keys once (`non-result keys (...)`)"
    names = {name.removesuffix(".*") for name in lists[0]}
    assert names == set(NON_RESULT_KEYS), (
        f"documented but not in the code: {sorted(names - NON_RESULT_KEYS)}; "
        f"in the code but not documented: {sorted(NON_RESULT_KEYS - names)}"
    )


def test_the_code_map_lists_every_module():
    text = _text(DOCS / "design.md")
    start = text.index("## Code map")
    end = text.find("\n## ", start + 1)
    code_map = text[start : end if end != -1 else len(text)]
    modules = {p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.py")}
    named = {n for n in BACKTICKED.findall(code_map) if n.endswith(".py") and not n.startswith("tests/")}
    assert not modules - named, f"modules missing from docs/design.md's code map: {sorted(modules - named)}"
    assert not named - modules, f"docs/design.md's code map names modules that do not exist: {sorted(named - modules)}"


def github_anchors(text: str) -> set[str]:
    """The anchors GitHub gives a page's headings (code blocks skipped; repeats get -1, -2, ...)."""
    anchors, seen, in_fence = set(), {}, False
    for line in text.splitlines():
        if FENCE.match(line):
            in_fence = not in_fence
            continue
        match = None if in_fence else re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if match:
            slug = re.sub(r"[^\w\- ]", "", match.group(1).lower()).replace(" ", "-")
            anchors.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
            seen[slug] = seen.get(slug, 0) + 1
    return anchors


def test_every_relative_link_points_to_an_existing_file():
    broken, checked = [], 0
    for page in PAGES:
        for target in LINK.findall(_text(page)):
            if re.match(r"[a-zA-Z][a-zA-Z0-9+.-]*:", target):  # https:, mailto:
                continue
            checked += 1
            path, _, anchor = target.partition("#")
            if target.startswith("/"):
                broken.append(f"{page.relative_to(ROOT)}: {target} (absolute: links must be relative)")
                continue
            resolved = (page.parent / path).resolve() if path else page
            if not resolved.exists() or ROOT not in (resolved, *resolved.parents):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and resolved.suffix == ".md" and anchor not in github_anchors(_text(resolved)):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert checked > 20, "no relative links found: is the link pattern still right?"
    assert not broken, "\n".join(broken)
