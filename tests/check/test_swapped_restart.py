"""The swapped restart's plan (reprocube.check.swapped_restart.plan_swap) on directories made here: which
of the control's files land where, when nothing could tell, and that nothing unbounded is read."""

from __future__ import annotations

import pytest

from reprocube.check import swapped_restart as state_swap
from reprocube.check.swapped_restart import plan_swap


def places(root, name: str, files: dict[str, bytes]) -> dict:
    work = root / name / "work"
    work.mkdir(parents=True)
    for relative, data in files.items():
        (work / relative).parent.mkdir(parents=True, exist_ok=True)
        (work / relative).write_bytes(data)
    return {"work": work}


def test_a_state_file_with_other_bytes_is_placed_under_the_uninterrupted_runs_name(tmp_path):
    clean = places(tmp_path, "clean", {"ckpt/seed0-epoch1.pt": b"a", "model.pt": b"m"})
    control = places(tmp_path, "control", {"ckpt/seed1-epoch1.pt": b"b", "model.pt": b"n"})
    plan, why = plan_swap(clean, control, frozenset({"work/ckpt/seed#-epoch#.pt"}), ["model.pt"], [])
    assert why is None
    assert [(p.source.name, p.target) for p in plan] == [("seed1-epoch1.pt", "work/ckpt/seed0-epoch1.pt")]


def test_nothing_telling_where_the_seed_changes_no_state_file(tmp_path):
    clean = places(tmp_path, "clean", {"ckpt.pt": b"same"})
    control = places(tmp_path, "control", {"ckpt.pt": b"same"})
    plan, why = plan_swap(clean, control, frozenset({"work/ckpt.pt"}), [], [])
    assert plan == [] and "with other bytes" in why


def test_the_size_is_refused_before_any_file_is_read(tmp_path, monkeypatch):
    clean = places(tmp_path, "clean", {"ckpt.pt": b"x"})
    control = places(tmp_path, "control", {})
    with open(control["work"] / "ckpt.pt", "wb") as sparse:  # 1 GiB that takes no disk
        sparse.truncate(1 << 30)

    def no_reading(a, b):
        pytest.fail("a file was hashed before the size was checked")

    monkeypatch.setattr(state_swap, "_same_bytes", no_reading)
    plan, why = plan_swap(clean, control, frozenset({"work/ckpt.pt"}), [], [])
    assert plan == [] and why == "the control left 1024 MiB, more than 2x what the uninterrupted run did"


def test_a_snapshot_copies_regular_files_only_within_its_budget(tmp_path):
    """The control's state copied as it runs: regular files under their own names, a link never followed
    (nor copied), nothing where the files exceed the budget; and a state file's identity changes with a
    save (what tells a copy that may mix two saves)."""
    import os

    source = places(tmp_path, "control", {"ckpt.npz": b"state", "logs/metrics.csv": b"1,2\n"})
    os.symlink("/etc/passwd", source["work"] / "link")
    into = {"work": tmp_path / "snapshot" / "work"}
    into["work"].mkdir(parents=True)
    assert state_swap.snapshot(source, into, budget=1 << 20) is None
    copied = sorted(str(p.relative_to(into["work"])) for p in into["work"].rglob("*") if p.is_file())
    assert copied == ["ckpt.npz", "logs/metrics.csv"] and not (into["work"] / "link").exists()
    assert (into["work"] / "ckpt.npz").read_bytes() == b"state"

    other = {"work": tmp_path / "other"}
    other["work"].mkdir()
    assert "more than" in state_swap.snapshot(source, other, budget=4) and list(other["work"].iterdir()) == []

    keys = frozenset({"work/ckpt.npz"})
    before = state_swap.state_files(source, keys)
    assert list(before) == ["work/ckpt.npz"]  # the log is no state file
    (source["work"] / "new.npz").write_bytes(b"saved again")
    os.replace(source["work"] / "new.npz", source["work"] / "ckpt.npz")
    assert state_swap.state_files(source, keys) != before
