"""Whether a restart uses the state it reads: `reprocube check`'s swapped restart.

A probe's record of where a restart resumed is the script's word, and that it read its checkpoint says only
that it opened the file: a restart that reads its checkpoint, throws the state away, trains again from
step 1 and records only the steps it had not recorded before passes both (issue 53, round 4). What tells
is what the restart does with another state. So a fresh run directory gets what the negative control (the
same script with another seed) left in its directories when it ended, its declared outputs and the
--copy inputs apart (an output that is also the checkpoint, a state file, is kept), under the names the
uninterrupted run gave the same files (a name holding the seed, runs/seed1/ckpt.pt, placed as
runs/seed0/ckpt.pt); the command is run there with the uninterrupted run's seed. A restart that continues
from the state it finds writes the control's results, not the uninterrupted run's; one that writes the
uninterrupted run's outputs bit for bit did not continue from it (it started again, or it refused another
run's checkpoint). Only outputs the restart wrote itself count (FileActivity): one placed there and left
alone shows nothing.

Regular files only are copied, never through a link; the trees are walked with a stack."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from reprocube.formats.output_files import link_above
from reprocube.orchestration.file_activity import state_key

MAX_ENTRIES = 100_000  # walked in one run's directories


@dataclass(frozen=True)
class Placement:
    source: Path  # the control's file
    target: str  # "<place>/<relative path>" in the fresh run


def regular_files(places: dict[str, Path]) -> list[str]:
    """Every regular file under `places` ({label: directory}) as "<label>/<relative path>": walked with a
    stack, links never followed, at most MAX_ENTRIES entries."""
    found: list[str] = []
    seen = 0
    for label, root in places.items():
        stack = [""]
        while stack:
            relative = stack.pop()
            try:
                with os.scandir(root / relative if relative else root) as entries:
                    listed = [
                        (e.name, e.is_dir(follow_symlinks=False), e.is_file(follow_symlinks=False)) for e in entries
                    ]
            except OSError:
                continue
            for name, is_dir, is_file in listed:
                seen += 1
                if seen > MAX_ENTRIES:
                    return found
                path = f"{relative}/{name}" if relative else name
                if is_file:
                    found.append(f"{label}/{path}")
                elif is_dir:
                    stack.append(path)
    return found


def plan_swap(
    clean: dict[str, Path],
    control: dict[str, Path],
    keys: frozenset[str],
    outputs: list[str],
    copies: list[str],
) -> tuple[list[Placement], str | None]:
    """Where each file the control left goes in the fresh run: its own name where the uninterrupted run has
    a file of that name, else that run's name for the same key where each run has one file of it, else its
    own. Not placed: the --copy inputs (the fresh run has its own) and declared outputs that are no state
    file. An empty plan and why where the control left nothing to swap in."""
    ours, theirs = regular_files(clean), regular_files(control)
    by_key: dict[str, list[str]] = {}
    for path in ours:
        by_key.setdefault(state_key(path), []).append(path)
    their_keys: dict[str, int] = {}
    for path in theirs:
        their_keys[state_key(path)] = their_keys.get(state_key(path), 0) + 1
    present, plan = set(ours), []
    for path in sorted(theirs):
        label, _, relative = path.partition("/")
        if label == "work" and relative.split("/", 1)[0] in copies:
            continue
        key = state_key(path)
        target = path
        if path not in present and len(by_key.get(key, [])) == 1 and their_keys[key] == 1:
            target = by_key[key][0]
        target_label, _, target_relative = target.partition("/")
        output = target_label == "work" and any(_under(target_relative, o) for o in outputs)
        if output and key not in keys:
            continue
        plan.append(Placement(control[label] / relative, target))
    if not plan:
        return [], "the control left no file but its outputs (no checkpoint to give a restart)"
    return plan, None


def place(plan: list[Placement], places: dict[str, Path]) -> None:
    """Copy each planned file into the fresh run's directories (made as needed, never through a link)."""
    for placement in plan:
        label, _, relative = placement.target.partition("/")
        if link_above(places[label], relative) is not None:
            continue  # a link on the way (only a command could have made one): never written through
        target = places[label] / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(placement.source, target, follow_symlinks=False)


def _under(name: str, output: str) -> bool:
    output = output.rstrip("/")
    return name == output or name.startswith(output + "/")
