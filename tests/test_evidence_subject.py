"""Evidence that cannot be moved onto another run, nor faked by the files nobody hashes (issue: run
directories and result files come from other people). Each rule has an attack of its own, forged as an
attacker would (with reprocube's own digest helpers where a digest is in the way):
- verify.json, compare.json and reproduce.json name their subject; report shows a verify.json as a run's
  only where that subject is the run's own, and a reproduce.json only with the receipt it names;
- compare judges where a run started and what it must hold from its hashed checkpoints (never from
  sessions.jsonl) and from its config's epochs;
- report --out never writes through a link nor into a directory report did not make;
- a `$` in a run directory's or a tensor's name is text on the plots, never matplotlib math."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load as load_safetensors
from safetensors.numpy import save as save_safetensors

from reprocube.training.checkpoint import weights_digest
from reprocube.training.receipt import self_digest

from helpers import error_lines, reprocube, rewrite_checkpoint_file

SMALL = ["framework=pytorch", "epochs=2", "log.every_steps=5", "log.progress=false"]


def quiet(_line: str) -> None:
    pass


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("evidence")


@pytest.fixture(scope="module")
def reference(generated, root) -> Path:
    """A run verified by `reprocube verify` (its verify.json inside it), 2 epochs."""
    reprocube("verify", *generated.overrides(), *SMALL, "verify.mid_epoch=false", cwd=root, timeout=600)
    return root / "runs" / "verify-pytorch" / "reference"


@pytest.fixture(scope="module")
def other(generated, root) -> Path:
    """Another run of the same data: another seed (other weights, another config hash), never verified."""
    reprocube("train", *generated.overrides(), *SMALL, "seed=7", "run_name=other", cwd=root)
    return root / "runs" / "other"


def manifest_of(checkpoint: Path) -> dict:
    return json.loads((checkpoint / "manifest.json").read_text())


def resign_weights(checkpoint: Path, change) -> None:
    """Change a checkpoint's weights and recompute every digest in the way (weights_digest, the file's
    sha256 and size, the manifest's own digest): the checkpoint reads as whole and consistent."""
    weights = dict(load_safetensors((checkpoint / "weights.safetensors").read_bytes()))
    weights = change(weights)
    rewrite_checkpoint_file(
        checkpoint, "weights.safetensors", save_safetensors(weights), weights_digest=weights_digest(weights)
    )


def verify_rows(page: str, label: str) -> list[str]:
    """The verdict table's rows about `label`'s verify.json."""
    return [row for row in re.findall(r"<tr>.*?</tr>", page) if f"<td>verify {label}" in row]


def report(*paths: Path, out: Path, check: bool = True):
    proc = reprocube("report", *map(str, paths), "--out", str(out), cwd=out.parent, check=check)
    return proc, (out / "report.html").read_text() if (out / "report.html").exists() else ""


# ---- 1. evidence names its subject ---------------------------------------------------------------------------


@pytest.mark.process
def test_verify_json_names_its_subject_and_report_shows_it_only_for_that_run(reference, other, tmp_path):
    final = reference / "checkpoints" / "epoch-0002"
    verdict = json.loads((reference / "verify.json").read_text())
    assert verdict["passed"] is True
    assert verdict["subject"] == {
        "checkpoint": "epoch-0002",
        "config_hash": manifest_of(final)["config_hash"],
        "weights_digest": manifest_of(final)["weights_digest"],
    }
    # Each check binds what it read of its run by digest: every checkpoint by its manifest's own sha256.
    for check in verdict["checks"]:
        run = reference if check["name"] == "reference" else reference.parent / check["name"]
        inputs = check["detail"]["inputs"]
        bound = (inputs["b"] if "b" in inputs else inputs)["checkpoints"]  # compare's {"a", "b"}, or the run's
        assert bound == {c.name: manifest_of(c)["manifest_sha256"] for c in (run / "checkpoints").iterdir()}, check
    _, page = report(reference, out=tmp_path / "own")
    rows = verify_rows(page, "reference")
    assert len(rows) == len(verdict["checks"]) and all("class='ok'" in row for row in rows)

    # The attack: another run's verify.json copied into a run that was never verified.
    shutil.copy(reference / "verify.json", other / "verify.json")
    try:
        _, page = report(reference, other, out=tmp_path / "copied")
    finally:
        (other / "verify.json").unlink()
    assert "compare other vs reference</td><td class='bad'>" in page  # the runs differ ...
    [row] = verify_rows(page, "other")  # ... and the copied verdict is not shown as the other run's
    assert "class='bad'" in row and "NOT about this run" in row and "class='ok'" not in row
    assert all("class='ok'" in row for row in verify_rows(page, "reference"))


@pytest.mark.process
def test_a_copied_verify_json_is_refused_even_for_a_run_of_the_same_config(reference, tmp_path):
    """Same config hash, same checkpoint name, other final weights (re-signed as a forger would)."""
    forged = tmp_path / "runs" / "reference"
    shutil.copytree(reference, forged)
    resign_weights(forged / "checkpoints" / "epoch-0002", lambda w: {k: v + 1 for k, v in w.items()})
    _, page = report(forged, out=tmp_path / "out")
    [row] = verify_rows(page, "reference")
    assert "NOT about this run" in row and "class='ok'" not in row


@pytest.mark.process
def test_a_verify_json_without_a_subject_is_unverifiable_never_green(reference, tmp_path):
    older = tmp_path / "older"
    shutil.copytree(reference, older)
    verdict = json.loads((older / "verify.json").read_text())
    del verdict["subject"]  # as a reprocube before subjects wrote it
    (older / "verify.json").write_text(json.dumps(verdict))
    _, page = report(older, out=tmp_path / "out")
    rows = verify_rows(page, "older")
    assert "unverifiable" in rows[0] and "class='warn'" in rows[0]
    assert len(rows) == 1 + len(verdict["checks"]) and not any("class='ok'" in row for row in rows)


@pytest.mark.process
@pytest.mark.parametrize("subject", [{"checkpoint": "epoch-0002"}, "x", {"checkpoint": 2}])
def test_a_malformed_verify_subject_is_refused_in_one_line(reference, tmp_path, subject):
    run = tmp_path / "run"
    shutil.copytree(reference, run)
    verdict = json.loads((run / "verify.json").read_text())
    verdict["subject"] = subject
    (run / "verify.json").write_text(json.dumps(verdict))
    proc, _ = report(run, out=tmp_path / "out", check=False)
    [line] = error_lines(proc)
    assert proc.returncode == 4 and "verify.json" in line and "subject" in line, proc.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.process
def test_compare_json_names_both_runs(reference, other, tmp_path):
    proc = reprocube("compare", str(reference), str(other), "--out", str(tmp_path / "c"), cwd=tmp_path, check=False)
    assert proc.returncode == 6
    text = (tmp_path / "c" / "compare.json").read_text()
    subject = json.loads(text)["subject"]
    for run, side in ((reference, "a"), (other, "b")):
        final = manifest_of(run / "checkpoints" / "epoch-0002")
        assert subject[side] == {
            "checkpoint": "epoch-0002",
            "config_hash": final["config_hash"],
            "weights_digest": final["weights_digest"],
        }
    assert "NaN" not in text and "Infinity" not in text


@pytest.fixture(scope="module")
def reproduced(generated, reference, root) -> Path:
    from reprocube.commands.reproduce import reproduce

    out = root / "reproduced"
    reproduce(reference.resolve(), out, [f"data_dir={generated.data_dir}"], echo=quiet)
    return out


def copy_reproduction(reproduced: Path, tmp_path: Path) -> tuple[Path, Path, dict]:
    """A copy of the reproduce directory: (directory, A's receipt in it (the copy report reads), result)."""
    copy = tmp_path / "reproduced"
    shutil.copytree(reproduced, copy, ignore=shutil.ignore_patterns("*.png", "report.html"))
    result = json.loads((copy / "reproduce.json").read_text())
    return copy, copy / result["inputs"]["a_receipt"]["path"], result


@pytest.mark.process
def test_reproduce_json_names_its_receipt_and_report_checks_it(reproduced, reference, tmp_path):
    copy, receipt, result = copy_reproduction(reproduced, tmp_path)
    raw = (reference / "receipt.json").read_bytes()
    final = json.loads(raw)["epochs"][-1]["weights_digest"]
    assert result["subject"] == {
        "receipt_sha256": hashlib.sha256(raw).hexdigest(),
        "config_hash": json.loads(raw)["config_hash"],
        "final_weights_digest": final,
    }
    _, page = report(copy, out=tmp_path / "ok")
    assert "Verdict: <span class='ok'>bit-identical</span>" in page and "nverifiable" not in page

    # The attack: another receipt put in A's place, its self-digest recomputed (receipt.self_digest) and
    # reproduce.json's source_sha256 set to it, the check that was there before subjects.
    forged = json.loads(receipt.read_bytes())
    forged["epochs"][-1]["test_accuracy"] = 0.999
    forged["receipt_sha256"] = self_digest(forged)
    receipt.write_text(json.dumps(forged, sort_keys=True, separators=(",", ":")))
    result["source_sha256"] = forged["receipt_sha256"]
    result["inputs"]["a_receipt"]["sha256"] = hashlib.sha256(receipt.read_bytes()).hexdigest()
    (copy / "reproduce.json").write_text(json.dumps(result))
    proc, _ = report(copy, out=tmp_path / "forged", check=False)
    [line] = error_lines(proc)
    assert proc.returncode == 4 and "is not the receipt this result is about" in line, proc.stderr
    assert not (tmp_path / "forged").exists()


@pytest.mark.process
def test_reproduce_json_with_a_subject_that_is_not_its_receipts_is_refused(reproduced, tmp_path):
    copy, _, result = copy_reproduction(reproduced, tmp_path)
    result["subject"]["final_weights_digest"] = "0" * 64
    (copy / "reproduce.json").write_text(json.dumps(result))
    proc, _ = report(copy, out=tmp_path / "out", check=False)
    [line] = error_lines(proc)
    assert proc.returncode == 4 and "subject does not describe" in line, proc.stderr


@pytest.mark.process
@pytest.mark.parametrize(
    "subject, message",
    [
        ({"receipt_sha256": "abc", "config_hash": "0" * 64, "final_weights_digest": None}, "receipt_sha256 must be"),
        ({"receipt_sha256": "0" * 64, "config_hash": 1, "final_weights_digest": None}, "config_hash must be"),
        ({"receipt_sha256": "0" * 64, "config_hash": "0" * 64}, "final_weights_digest must be"),
        ([], "subject must be a JSON object"),
    ],
)
def test_a_malformed_reproduce_subject_is_refused_in_one_line(reproduced, tmp_path, subject, message):
    copy, _, result = copy_reproduction(reproduced, tmp_path)
    result["subject"] = subject
    (copy / "reproduce.json").write_text(json.dumps(result))
    proc, _ = report(copy, out=tmp_path / "out", check=False)
    [line] = error_lines(proc)
    assert proc.returncode == 4 and "reproduce.json" in line and message in line, line


@pytest.mark.process
def test_a_reproduce_json_without_a_subject_is_unverifiable(reproduced, tmp_path):
    copy, _, result = copy_reproduction(reproduced, tmp_path)
    del result["subject"]  # as a reprocube before subjects wrote it
    (copy / "reproduce.json").write_text(json.dumps(result))
    _, page = report(copy, out=tmp_path / "out")
    assert "Verdict: <span class='warn'>bit-identical (unverifiable)</span>" in page
    assert "<span class='ok'>bit-identical" not in page


# ---- 2. what a run must hold: from its hashed checkpoints and its config, never from sessions.jsonl ------------


def forge_sessions(run: Path, epoch: int) -> None:
    """sessions.jsonl claims the run started from another run's epoch-`epoch` checkpoint (no digest covers it)."""
    session = json.loads((run / "sessions.jsonl").read_text().splitlines()[0])
    session["position"] = {"epoch": epoch, "step_in_epoch": 0, "global_step": 0}
    session["resumed_from"] = "/elsewhere/checkpoints/epoch-0002"
    (run / "sessions.jsonl").write_text(json.dumps(session) + "\n")


@pytest.mark.process
def test_a_forged_sessions_jsonl_does_not_excuse_a_missing_checkpoint(other, tmp_path):
    lacking = tmp_path / "lacking"
    shutil.copytree(other, lacking)
    shutil.rmtree(lacking / "checkpoints" / "epoch-0002")
    forge_sessions(lacking, 2)
    proc = reprocube("compare", str(other), str(lacking), "--out", str(tmp_path / "c"), cwd=tmp_path, check=False)
    assert proc.returncode == 6 and "identical (" not in proc.stdout, proc.stdout
    assert "not identical: B lacks epoch-0002" in proc.stdout
    assert json.loads((tmp_path / "c" / "compare.json").read_text())["missing_epoch_checkpoints"]["b"] == ["epoch-0002"]


@pytest.mark.process
def test_two_runs_short_of_their_configs_epochs_are_not_identical(other, tmp_path):
    """Neither run holds the last epoch its config asks for: the epoch both lack was not shown to agree."""
    for name in ("a", "b"):
        shutil.copytree(other, tmp_path / name)
        shutil.rmtree(tmp_path / name / "checkpoints" / "epoch-0002")
        forge_sessions(tmp_path / name, 2)
    proc = reprocube(
        "compare", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(tmp_path / "c"), cwd=tmp_path, check=False
    )
    assert proc.returncode == 6, proc.stdout
    assert "not identical: A lacks epoch-0002; B lacks epoch-0002 (the 1 in common agree)" in proc.stdout


@pytest.mark.process
def test_an_epoch_checkpoint_renamed_as_a_step_checkpoint_is_not_a_start(other, tmp_path):
    """Renaming epoch-0001 step-0000NN (its global step) would make the run look started after epoch 1."""
    renamed = tmp_path / "renamed"
    shutil.copytree(other, renamed)
    step = manifest_of(renamed / "checkpoints" / "epoch-0001")["global_step"]
    (renamed / "checkpoints" / "epoch-0001").rename(renamed / "checkpoints" / f"step-{step:06d}")
    proc = reprocube("compare", str(other), str(renamed), "--out", str(tmp_path / "c"), cwd=tmp_path, check=False)
    assert proc.returncode == 6, proc.stdout
    assert "is not the one its name says" in proc.stderr and "identical (" not in proc.stdout


@pytest.mark.process
def test_a_run_started_from_another_runs_checkpoint_may_lack_the_epochs_before(generated, other, tmp_path):
    """The case sessions.jsonl was read for: its first epoch checkpoint's manifest says where it can have started."""
    start = other / "checkpoints" / "epoch-0001"
    reprocube("train", *generated.overrides(), *SMALL, "seed=7", "run_name=branch", f"resume={start}", cwd=tmp_path)
    branch = tmp_path / "runs" / "branch"
    assert sorted(p.name for p in (branch / "checkpoints").iterdir()) == ["epoch-0002"]
    forge_sessions(branch, 0)  # what sessions.jsonl says no longer matters either way
    proc = reprocube("compare", str(other), str(branch), "--out", str(tmp_path / "c"), cwd=tmp_path)
    assert "identical (1 checkpoint)" in proc.stdout


def test_non_finite_weights_are_counted_apart_and_never_written_as_nan():
    from reprocube.analysis.tensors import tensor_differences
    from reprocube.files import json_text

    a = {"w": np.array([1.0, 2.0, 3.0, np.nan], np.float32), "d": np.array([1e308, 0.0])}
    b = {"w": np.array([1.0, np.inf, np.nan, np.nan], np.float32), "d": np.array([-1e308, 0.0])}
    rows = {row["tensor"]: row for row in tensor_differences(a, b)}
    assert rows["w"]["non_finite"] == 2 and rows["w"]["max_abs"] == 0.0
    assert rows["d"]["non_finite"] == 1  # 1e308 - -1e308 overflows
    json_text(rows)  # raises on NaN or infinity


# ---- 3. report --out: never through a link, never into a directory report did not make ---------------------------


def snapshot(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): "link" if p.is_symlink() else p.read_text() if p.is_file() else "dir"
        for p in sorted(root.rglob("*"))
    }


@pytest.mark.process
@pytest.mark.parametrize("kind", ["link", "foreign", "foreign-report", "file"])
def test_report_out_refuses_what_it_did_not_make(other, tmp_path, kind):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "report.html").write_text("my own page\n")
    (mine / "notes.txt").write_text("keep\n")
    out = {"link": tmp_path / "out", "foreign": mine, "foreign-report": tmp_path / "page", "file": mine / "notes.txt"}[
        kind
    ]
    if kind == "link":
        out.symlink_to(mine, target_is_directory=True)
    if kind == "foreign-report":
        out.mkdir()
        (out / "report.html").write_text("someone's report\n")
    before = snapshot(tmp_path)
    proc = reprocube("report", str(other), "--out", str(out), cwd=tmp_path, check=False)
    [line] = error_lines(proc)
    assert proc.returncode == 2 and line.startswith("reprocube: error: --out") and "Traceback" not in proc.stderr
    assert snapshot(tmp_path) == before


@pytest.mark.process
def test_report_writes_again_into_a_directory_it_made(other, tmp_path):
    out = tmp_path / "report"
    out.mkdir()  # empty: accepted
    for _ in range(2):
        proc = reprocube("report", str(other), "--out", str(out), cwd=tmp_path, check=False)
        assert proc.returncode == 0, proc.stderr
    assert (out / ".reprocube-report").is_file() and (out / "report.html").stat().st_size > 10_000


# ---- 4. names on plots are text, never matplotlib math -----------------------------------------------------------


@pytest.mark.process
def test_a_dollar_in_a_run_or_tensor_name_is_shown_literally(other, tmp_path):
    odd = tmp_path / "$\\foo$"
    shutil.copytree(other, odd)
    shutil.copytree(other, tmp_path / "$x$")
    for checkpoint in (odd / "checkpoints").iterdir():  # a tensor named like a formula too, re-signed
        resign_weights(checkpoint, lambda w: {("$\\frac{$" if i == 0 else k): v for i, (k, v) in enumerate(w.items())})
    proc, page = report(other, odd, tmp_path / "$x$", out=tmp_path / "out", check=False)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert f"<code>{odd}</code>" in page and f"<code>{tmp_path / '$x$'}</code>" in page
    assert "compare $\\foo$ vs other" in page and "$\\frac{$ (only in run B)" in page
