"""Issue 53 item 4: every declared output compared, or the comparison says what was not. A regular file
against a FIFO, a directory, a link or nothing differs; --ignore removes what it matches and never makes
an output "written by neither run"; FILE:KEY and FILE:COLUMN leave one field out of a file, recorded; a
Keras 3 `.keras` archive is compared by its weights and config, its date_saved named as ignored. Mostly
reprocube.analysis.outputs in-process (fast), and `reprocube diff` where its exit status is the point."""

from __future__ import annotations

import io
import json
import os
import shutil
import zipfile
from pathlib import Path

import h5py
import numpy as np
import pytest

from reprocube.analysis.outputs import compare_outputs, parse_ignore
from reprocube.errors import ConfigError

from helpers import error_lines, reprocube


def runs(tmp_path: Path) -> tuple[Path, Path]:
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    return a, b


def test_a_regular_file_against_a_fifo_differs_and_fifos_on_both_sides_are_not_compared(tmp_path):
    """A resumed run that leaves a FIFO where the clean run wrote the model used to pass ("not compared")."""
    a, b = runs(tmp_path)
    for root in (a, b):
        (root / "out").mkdir()
        (root / "out" / "log.txt").write_text("same\n")
        os.mkfifo(root / "out" / "both.pipe")
    np.save(a / "out" / "model.npy", np.ones(3))
    os.mkfifo(b / "out" / "model.npy")
    comparison = compare_outputs(a, b, ["out"], [])
    files = {f["path"]: f for f in comparison["files"]}
    assert files["out/model.npy"]["same"] is False and files["out/model.npy"].get("compared", True)
    assert files["out/model.npy"]["detail"] == "a regular file in A, a FIFO in B"
    assert comparison["identical"] is False and comparison["first"]["path"] == "out/model.npy"
    assert comparison["not_compared"] == ["out/both.pipe"]  # neither side readable: named, not a difference
    # A declared file that is a FIFO in B, a directory, a link: each differs from A's regular file.
    (a / "m.pt").write_bytes(b"x"), (b / "m.pt").mkdir()
    (a / "l.txt").write_text("x"), (b / "l.txt").symlink_to("elsewhere")
    (a / "f.bin").write_bytes(b"x"), os.mkfifo(b / "f.bin")
    comparison = compare_outputs(a, b, ["m.pt", "l.txt", "f.bin"], [])
    details = {f["path"]: f["detail"] for f in comparison["files"]}
    assert details == {
        "f.bin": "a regular file in A, a FIFO in B",
        "l.txt": "a regular file in A, a symbolic link in B",
        "m.pt": "only in A (a regular file)",  # B's directory holds no file: nothing under m.pt in B
    }
    assert comparison["not_compared"] == [] and comparison["identical"] is False


def test_ignore_never_makes_an_output_missing_and_ignoring_everything_is_reported(tmp_path):
    """`--output run.json --ignore run.json` and `--output . --ignore run.json` used to say "run.json was
    written by neither run" (a deterministic script became not-deterministic)."""
    a, b = runs(tmp_path)
    for root, wall in ((a, 1.5), (b, 2.5)):
        (root / "run.json").write_text(json.dumps({"loss": 0.25, "wall_s": wall}))
        np.save(root / "model.npy", np.arange(4.0))
    everything = compare_outputs(a, b, ["run.json"], ["run.json"])
    assert everything["missing"] == [] and everything["ignored"] == ["run.json"] and everything["all_ignored"]
    assert everything["identical"] is False and everything["files"] == []  # nothing compared: never identical
    dot = compare_outputs(a, b, ["."], ["run.json"])
    assert dot["missing"] == [] and dot["ignored"] == ["run.json"] and not dot["all_ignored"]
    assert dot["identical"] is True and [f["path"] for f in dot["files"]] == ["model.npy"]
    # An output that no run writes is still told apart from a difference, whatever --ignore says.
    neither = compare_outputs(a, b, ["model.npy", "absent.pt"], ["absent.pt"])
    assert neither["missing"] == ["absent.pt"] and neither["ignored"] == [] and not neither["all_ignored"]
    with pytest.raises(ConfigError, match="FILE:KEY"):
        parse_ignore(["run.json:"])


def test_ignore_file_key_leaves_one_field_out_and_the_rest_must_be_equal(tmp_path):
    a, b = runs(tmp_path)
    rows = "epoch,loss,wall_s,host\n1,0.5,{},{}\n2,0.25,{},{}\n"
    (a / "metrics.csv").write_text(rows.format(1.0, "gpu-1", 2.0, "gpu-1"))
    (b / "metrics.csv").write_text(rows.format(1.5, "gpu-7", 2.5, "gpu-7"))
    (a / "run.json").write_text(json.dumps({"loss": 0.25, "timing": {"wall_s": 1.0}, "steps": [1, 2]}))
    (b / "run.json").write_text(json.dumps({"loss": 0.25, "timing": {"wall_s": 9.0}, "steps": [1, 2]}))
    (a / "cfg.yaml").write_text("lr: 0.1\nstarted: 2024-01-01 10:00:00\n")
    (b / "cfg.yaml").write_text("lr: 0.1\nstarted: 2024-01-02 11:00:00\n")
    outputs = ["metrics.csv", "run.json", "cfg.yaml"]
    ignore = ["metrics.csv:wall_s", "metrics.csv:host", "run.json:timing.wall_s", "*.yaml:started"]
    assert compare_outputs(a, b, outputs, [])["identical"] is False  # without the ignores they differ
    comparison = compare_outputs(a, b, outputs, ignore)
    assert comparison["identical"] is True, comparison
    files = {f["path"]: f for f in comparison["files"]}
    assert files["run.json"]["ignored_fields"] == ["timing.wall_s"]
    assert files["metrics.csv"]["ignored_fields"] == ["wall_s", "host"]
    assert files["cfg.yaml"]["detail"] == "identical but for the ignored started"
    # Anything else that differs still differs, and is named.
    (b / "run.json").write_text(json.dumps({"loss": 0.5, "timing": {"wall_s": 9.0}, "steps": [1, 2]}))
    (b / "metrics.csv").write_text(rows.format(1.5, "gpu-7", 2.5, "gpu-7").replace("0.25", "0.26"))
    comparison = compare_outputs(a, b, outputs, ignore)
    files = {f["path"]: f for f in comparison["files"]}
    assert comparison["identical"] is False and files["run.json"]["key"] == "loss"
    assert files["metrics.csv"]["detail"].startswith("row 3:") and files["metrics.csv"]["line"] == 3
    # A number written otherwise (1 vs 1.0) is not the same bytes: not equal.
    (a / "n.json").write_text('{"x": 1, "t": 1}'), (b / "n.json").write_text('{"x": 1.0, "t": 2}')
    assert compare_outputs(a, b, ["n.json"], ["n.json:t"])["identical"] is False


def test_ignore_file_key_in_yaml_refuses_duplicate_keys_and_compares_values_as_written(tmp_path):
    """PyYAML kept the last of two `loss:` keys silently (B's 0.9 hidden) and read yes/true, 0x10/16 and
    0.5/0.50 as one value: with `m.yaml:t` ignored the files were "identical". Now a duplicate key is a
    difference that says so, and every other scalar must be written alike; the ignored key still goes,
    nested or in a list, and comments and layout do not count."""
    a, b = runs(tmp_path)
    (a / "m.yaml").write_text("t: 1\nloss: 0.5\nconverged: yes\nsteps: 0x10\n")
    (b / "m.yaml").write_text("t: 2\nloss: 0.9\nloss: 0.50\nconverged: true\nsteps: 16\n")
    [entry] = compare_outputs(a, b, ["m.yaml"], ["m.yaml:t"])["files"]
    assert entry["same"] is False and "found the key 'loss' twice" in entry["detail"], entry
    for spelled, other in (("converged: yes", "converged: true"), ("steps: 0x10", "steps: 16"), ("x: 0.5", "x: 0.50")):
        (a / "m.yaml").write_text(f"t: 1\n{spelled}\n"), (b / "m.yaml").write_text(f"t: 2\n{other}\n")
        [entry] = compare_outputs(a, b, ["m.yaml"], ["m.yaml:t"])["files"]
        assert entry["same"] is False and entry["key"] == spelled.split(":")[0], entry
        assert entry["detail"].endswith("(as written)"), entry
    (a / "m.yaml").write_text("run: {t: 1, lr: 0.1}  # a comment\nlog: [a, 1]\n")
    (b / "m.yaml").write_text("run:\n  t: 7\n  lr: 0.1\nlog:\n- a\n- 2\n")
    comparison = compare_outputs(a, b, ["m.yaml"], ["m.yaml:run.t", "m.yaml:log.1"])
    assert comparison["identical"] is True, comparison


@pytest.mark.process
def test_diff_ignores_a_field_and_refuses_to_ignore_everything(tmp_path):
    a, b = runs(tmp_path)
    (a / "run.json").write_text('{"loss": 1, "host": "a"}'), (b / "run.json").write_text('{"loss": 1, "host": "b"}')
    assert reprocube("diff", "a/run.json", "b/run.json", cwd=tmp_path, check=False).returncode == 6
    proc = reprocube("diff", "a/run.json", "b/run.json", "--ignore", "run.json:host", cwd=tmp_path, check=False)
    assert proc.returncode == 0 and "run.json: identical but for the ignored host" in proc.stdout, proc.stdout
    proc = reprocube("diff", "a", "b", "--ignore", "run.json", cwd=tmp_path, check=False)
    [line] = error_lines(proc)
    assert proc.returncode == 2 and "--ignore leaves out every file" in line, proc.stderr


@pytest.mark.process
def test_a_directory_with_a_metadata_file_orbax_cannot_read_is_compared_file_by_file(tmp_path):
    """Any directory holding a `_METADATA` was one Orbax output: Orbax could read neither side, so it was
    "not compared" and a differing predictions.npy inside was hidden (diff exit 0). Now a `_METADATA`
    that is not Orbax's leaves the files compared one by one, and one Orbax cannot read is compared file
    by file as one output: the same only where every file is."""
    a, b = runs(tmp_path)
    for side, shift in ((a, 0.0), (b, 1.0)):
        (side / "results").mkdir()
        (side / "results" / "_METADATA").write_text('{"format": "mine"}\n')
        np.save(side / "results" / "predictions.npy", np.arange(5.0) + shift)
        np.save(side / "final.npy", np.ones(3))
    proc = reprocube("diff", "a", "b", cwd=tmp_path, check=False)
    assert proc.returncode == 6 and "results/predictions.npy: tensor array" in proc.stdout, proc.stdout
    pytest.importorskip("orbax.checkpoint")
    for side in (a, b):
        (side / "results" / "_METADATA").write_text('{"tree_metadata": 5}')  # Orbax's key, not Orbax's value
    # The directory as one output, and the file beside Orbax's own ones (the script's: compared as any file).
    entries = {f["path"]: f for f in compare_outputs(a, b, ["results"], [])["files"]}
    assert sorted(entries) == ["results", "results/predictions.npy"], entries
    entry = entries["results"]
    assert entry["same"] is False and entry.get("compared", True), entry
    assert "could not be read as an Orbax checkpoint" in entry["detail"], entry
    assert "the first predictions.npy: tensor array" in entry["detail"], entry
    np.save(b / "results" / "predictions.npy", np.arange(5.0))
    comparison = compare_outputs(a, b, ["results"], [])
    assert comparison["identical"] is True and "all 2 identical" in comparison["files"][0]["detail"], comparison


@pytest.mark.process
def test_an_orbax_checkpoint_is_compared_by_its_tensors_and_the_scripts_files_beside_them(tmp_path):
    """Round 3 (F5, F11): a history.json saved in the Orbax directory, and Orbax's _CHECKPOINT_METADATA's
    custom_metadata, were never compared (the directory was its tensors only). Now both are; the step
    metadata without its times, Orbax's own marker (its path) and array files never."""
    ocp = pytest.importorskip("orbax.checkpoint")
    a, b = runs(tmp_path)
    for side, seen in ((a, 1024), (b, 512)):
        checkpointer = ocp.StandardCheckpointer()
        checkpointer.save((side / "final").absolute(), {"w": np.ones(3)}, custom_metadata={"samples_seen": seen})
        checkpointer.wait_until_finished()
        (side / "final" / "history.json").write_text(json.dumps([0.5, 0.25] if seen == 1024 else [0.25]))
    comparison = compare_outputs(a, b, ["final"], [])
    entries = {f["path"]: f for f in comparison["files"]}
    assert sorted(entries) == ["final", "final/_CHECKPOINT_METADATA", "final/history.json"], entries
    assert entries["final"]["same"] is True  # the tensors
    assert entries["final/history.json"]["same"] is False
    metadata = entries["final/_CHECKPOINT_METADATA"]
    assert metadata["same"] is False and "samples_seen" in metadata["detail"], metadata
    # The same custom_metadata and history: identical, whatever the times and the paths Orbax wrote.
    for side in (a, b):
        shutil.rmtree(side / "final")
        checkpointer = ocp.StandardCheckpointer()
        checkpointer.save((side / "final").absolute(), {"w": np.ones(3)}, custom_metadata={"samples_seen": 7})
        checkpointer.wait_until_finished()
        (side / "final" / "history.json").write_text("[0.5]")
    assert compare_outputs(a, b, ["final"], [])["identical"] is True
    # `reprocube diff` of the two checkpoints themselves: the files beside the tensors too (round 7's F9: it
    # said identical where history.json differed).
    proc = reprocube("diff", "a/final", "b/final", cwd=tmp_path, check=False)
    assert proc.returncode == 0 and "identical" in proc.stdout, proc.stdout
    (b / "final" / "history.json").write_text("[0.75]")
    proc = reprocube("diff", "a/final", "b/final", cwd=tmp_path, check=False)
    assert proc.returncode == 6 and "final/history.json: first differing value" in proc.stdout, proc.stdout


def keras_archive(weights: dict[str, np.ndarray], date: str, config: dict | None = None) -> bytes:
    """A Keras 3 `.keras` file as Keras writes it: a zip of model.weights.h5, config.json, metadata.json."""
    h5 = io.BytesIO()
    with h5py.File(h5, "w") as file:
        for name, value in weights.items():
            file[name] = value
    blob = io.BytesIO()
    with zipfile.ZipFile(blob, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("metadata.json", json.dumps({"keras_version": "3.15.1", "date_saved": date}))
        archive.writestr("config.json", json.dumps(config or {"class_name": "Sequential", "units": 4}))
        archive.writestr("model.weights.h5", h5.getvalue())
    return blob.getvalue()


def test_a_keras_archive_is_compared_by_its_weights_and_config_without_date_saved(tmp_path):
    """It used to be read as HDF5 and fail: every .keras output differed (a deterministic script became
    not-deterministic)."""
    a, b = runs(tmp_path)
    weights = {"layers/dense/vars/0": np.ones((2, 3), np.float32), "layers/dense/vars/1": np.zeros(3, np.float32)}
    (a / "model.keras").write_bytes(keras_archive(weights, "2024-01-01@10:00:00"))
    (b / "model.keras").write_bytes(keras_archive(weights, "2024-01-01@10:00:07"))
    comparison = compare_outputs(a, b, ["model.keras"], [])
    [entry] = comparison["files"]
    assert comparison["identical"] is True and entry["ignored_fields"] == ["metadata.json:date_saved"], entry
    assert compare_outputs(a, b, ["model.keras"], [], explain=False)["identical"] is True  # the control's way too
    changed = {**weights, "layers/dense/vars/0": np.nextafter(weights["layers/dense/vars/0"], np.float32(2))}
    (b / "model.keras").write_bytes(keras_archive(changed, "2024-01-01@10:00:07"))
    [entry] = compare_outputs(a, b, ["model.keras"], [])["files"]
    assert entry["same"] is False and entry["tensor"]["tensor"] == "layers/dense/vars/0" and "1 ULP" in entry["detail"]
    (b / "model.keras").write_bytes(keras_archive(weights, "x", {"class_name": "Sequential", "units": 5}))
    [entry] = compare_outputs(a, b, ["model.keras"], [])["files"]
    assert entry["same"] is False and entry["key"] == "config.json:units", entry


def test_an_ignored_field_held_by_one_file_only_or_elsewhere_is_a_difference(tmp_path):
    """Round 10: `--ignore metrics.csv:time` hid a column the resumed run's file did not have at all; a
    field is left out only where both files hold it, at one place."""
    a, b = runs(tmp_path)
    (a / "metrics.csv").write_text("step,loss,time\n1,0.5,3.1\n")
    (b / "metrics.csv").write_text("step,loss\n1,0.5\n")
    (a / "run.json").write_text(json.dumps({"loss": 0.5, "time": 3.1}))
    (b / "run.json").write_text(json.dumps({"loss": 0.5}))
    (a / "moved.csv").write_text("step,loss,time\n1,0.5,3.1\n")
    (b / "moved.csv").write_text("time,step,loss\n4.2,1,0.5\n")
    (a / "same.csv").write_text("step,loss,time\n1,0.5,3.1\n")
    (b / "same.csv").write_text("step,loss,time\n1,0.5,9.9\n")
    ignore = ["*.csv:time", "run.json:time"]
    files = {
        f["path"]: f
        for f in compare_outputs(a, b, ["metrics.csv", "run.json", "moved.csv", "same.csv"], ignore)["files"]
    }
    for name in ("metrics.csv", "run.json", "moved.csv"):
        assert files[name]["same"] is False and "only, or at another place" in files[name]["detail"], files[name]
    assert files["same.csv"]["same"] is True


def test_an_orbax_tree_of_other_keys_or_containers_is_a_difference(tmp_path):
    """Round 10: {"params": {"w": w}} and {"params.w": w} flatten to one name; Orbax restores them as other
    trees. The tree's structure is compared with its tensors."""
    ocp = pytest.importorskip("orbax.checkpoint")
    a, b = runs(tmp_path)
    w = np.arange(3, dtype=np.float32)
    for side, tree in ((a, {"params": {"w": w}}), (b, {"params.w": w})):
        checkpointer = ocp.StandardCheckpointer()
        checkpointer.save((side / "final").absolute(), tree)
        checkpointer.wait_until_finished()
    entries = {f["path"]: f for f in compare_outputs(a, b, ["final"], [])["files"]}
    assert entries["final"]["same"] is False and "the tree is not" in entries["final"]["detail"], entries["final"]
