"""The swapped restart's plan (reprocube.orchestration.state_swap.plan_swap) on directories made here: which
of the control's files land where, when nothing could tell, and that nothing unbounded is read."""

from __future__ import annotations

import pytest

from reprocube.orchestration import state_swap
from reprocube.orchestration.state_swap import plan_swap


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
