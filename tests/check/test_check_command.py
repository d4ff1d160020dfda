"""`reprocube check -- CMD` (issue 36) on the example scripts in examples/: every verdict and exit status,
each from a real script run, stopped by real signals and restarted; and `reprocube diff`. The NumPy
example starts in a fraction of a second, so most verdicts cost a few seconds; the PyTorch example shows
the resume bug researchers write (no RNG state in the checkpoint) and its fix."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from reprocube.results.check_result import read_check
from test_report_browser import decode_images, rendered

from helpers import error_lines, reprocube, wait_until

pytestmark = pytest.mark.process  # every test here starts a process: not in make test-quick

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
NUMPY = [sys.executable, str(EXAMPLES / "numpy_sgd.py"), "--epochs", "4", "--sleep", "0.1"]
OUTPUTS = ["--output", "final.npz", "--output", "metrics.csv"]
# A small script's "checkpoint": its step count, read back when there (a restart resumes from it) and saved
# after each of 4 steps of 0.2 s: a stop after 0.5 s follows two saves, the restart reads the file and saves
# the rest (check counts a stop only after a save that the restart read, then saved after).
RESUMES = (
    "n = int(open('state').read()) if os.path.exists('state') else 0\n"
    "for i in range(n, 4): time.sleep(0.2); open('state', 'w').write(str(i + 1))\n"
)


def check(tmp_path: Path, *args: str, command=NUMPY, name: str = "out") -> tuple[subprocess.CompletedProcess, dict]:
    proc = reprocube(
        "check", "--out", name, *args, "--", *command, cwd=tmp_path, check=False, timeout=600
    )  # (--out relative: the command runs in another directory)
    path = tmp_path / name / "check.json"
    return proc, json.loads(path.read_text()) if path.exists() else {}


def test_a_script_that_saves_its_generator_resumes_exactly(tmp_path):
    # 0.4 s of work an epoch, not 0.1: with 0.7 s runs, mostly start-up, the last restart once took as long as an
    # uninterrupted run (1.0 s against 0.7 s on a busy CI machine) and the verdict rightly stayed not-proven.
    command = [*NUMPY[:-1], "0.4", "--save-rng"]
    proc, result = check(tmp_path, *OUTPUTS, "--seed-env", "SEED", "--at-line", "saved", command=command)
    assert proc.returncode == 0 and result["verdict"] == "resume-exact", proc.stdout + proc.stderr
    stopped = next(r for r in result["runs"] if r["name"] == "stopped")
    assert stopped["stops_landed"] == 2 and len(stopped["attempts"]) == 3
    assert [a["exit"] for a in stopped["attempts"]] == [-signal.SIGTERM, -signal.SIGTERM, 0]
    assert result["comparisons"]["control"]["identical"] is False  # the outputs depend on the training
    # The schema's strict reader: three things left unchecked, what no run on this machine can show (state at a
    # path outside the run's directories that its restarts find again), what the moved-weights restarts (the
    # state after each stop, its weights moved, in another directory) cannot: they recorded another first
    # loss, so they used their weights, but the stopped run's own restarts ran elsewhere (that made the swapped
    # restart, the control's state copied as it ran after its last save but one, redundant: it did not run);
    # and state that expires with time, tried only as far as the last restart's wait.
    outside, replay, waited = read_check(tmp_path / "out" / "check.json")["not_checked"]
    assert waited.startswith("state that expires with time") and "the last restart came 1 s after its stop" in waited
    assert replay.startswith("whether the stopped run's own restarts used the weights they read: the moved-weights")
    assert (
        outside.startswith("state kept outside the run's directories")
        and "not checked: " + outside in (result["summary"])
    )
    assert (
        "restarts given its state after stops 1 and 2, in another directory, weights moved, used them"
        in (result["summary"])
    )
    assert (tmp_path / "out" / "snapshot" / "control" / "work" / "ckpt.npz").is_file()
    assert "swap" not in result["comparisons"] and "swapped" not in [run["name"] for run in result["runs"]]
    log = (tmp_path / "out" / "logs" / "stopped.log").read_text()
    assert log.count("resumed at epoch") == 2  # the script really restarted from its checkpoints
    # The probe: every update of the stopped run equals the uninterrupted run's, each restart matched
    # to the checkpoint it resumed from (4 epochs of 16 steps, stopped after epochs 1 and 2).
    traced = result["probe"]["resume"]
    assert (traced["compared_steps"], traced["reference_steps"], traced["first_difference"]) == (64, 64, None)
    assert [(a["resumed_at"], a["how"]) for a in traced["attempts"]] == [(0, "first"), (16, "matched"), (32, "matched")]
    assert "each of its 64 updates" in result["summary"]


def test_a_script_that_forgets_its_generator_differs_and_the_tensor_is_named(tmp_path):
    proc, result = check(tmp_path, *OUTPUTS, "--seed-env", "SEED", "--at-line", "saved")
    assert proc.returncode == 6 and result["verdict"] == "resume-differs"
    files = {f["path"]: f for f in result["comparisons"]["resume"]["files"]}
    assert files["final.npz"]["tensor"]["tensor"] == "w" and files["final.npz"]["tensor"]["max_ulp"] > 0
    assert "after 2 stops by SIGTERM" in result["summary"]
    assert result["comparisons"]["repeat"][0]["identical"] is True  # deterministic: resume is to blame
    # The probe names the first update after the first stop (epoch 1 = steps 1-16) and the tensor.
    first = result["probe"]["resume"]["first_difference"]
    assert (first["step"], first["after_stop"], first["tensors"]) == (17, 1, ["w"])
    assert "after stop 1 the first update already differs: step 17," in result["summary"]
    # Its page (reprocube report CHECK_DIR), as a browser shows it: the verdict, the summary and what to
    # do next before the figure, the figure decoded, every output's comparison.
    proc = reprocube("report", "out", "--out", "page", cwd=tmp_path)
    assert proc.stdout.strip() == f"report: {Path('page') / 'report.html'}"
    page = (tmp_path / "page" / "report.html").read_text()
    assert len(decode_images(page)) == 1 and (tmp_path / "page" / "losses.png").is_file()
    dom, text, title = rendered(tmp_path / "page" / "report.html", tmp_path)
    assert title == "decoded 1/1", title
    assert "Verdict: resume-differs (exit 6)" in text and result["summary"] in text
    assert text.index("Next: Compare what the checkpoint holds") < dom.index("<img")
    assert "64 of 64 updates compared" in text and "the first that differs is step 17, after stop 1" in text
    assert "tensor w: max abs" in text
    # What each stop proved, as check.json's stop_evidence says it.
    assert "Each stop" in text and text.index("Each stop") < dom.index("<img")
    for evidence in result["stop_evidence"]:
        assert evidence["how"] in text


def test_report_of_a_check_refuses_a_malformed_check_json_in_one_line(tmp_path):
    proc, result = check(tmp_path, *OUTPUTS, "--stops", "1", "--at-line", "saved", command=[*NUMPY, "--save-rng"])
    assert result["verdict"] == "resume-exact"
    result["summary"] = "<script>alert(1)</script>\x1b[31m"  # a value from a file is text, escaped
    (tmp_path / "out" / "check.json").write_text(json.dumps(result))
    page = reprocube("report", "out", "--out", "page", cwd=tmp_path)
    assert page.returncode == 0 and "<script>alert" not in (tmp_path / "page" / "report.html").read_text()
    for change, message in (
        ({"verdict": "fine"}, "verdict must be one of"),
        ({"runs": [{"name": "/etc/passwd", "attempts": []}]}, "name must be one of"),
        ({"probe": {"resume": {"attempts": 3}}}, "attempts must be a list"),
        ({"stop_evidence": [{"stop": 1, "landed": "yes", "effective": True, "how": "x"}]}, "landed must be"),
    ):
        (tmp_path / "out" / "check.json").write_text(json.dumps({**result, **change}))
        proc = reprocube("report", "out", "--out", "bad", cwd=tmp_path, check=False)
        [line] = error_lines(proc)
        assert proc.returncode == 4 and "check.json" in line and message in line, line
        assert not (tmp_path / "bad").exists()
    (tmp_path / "out" / "check.json").write_text(json.dumps(result))
    elsewhere = tmp_path / "elsewhere"
    (tmp_path / "out" / "probe").rename(elsewhere)
    (tmp_path / "out" / "probe").symlink_to(elsewhere)  # the traces are read from inside the directory only
    reprocube("report", "out", "--out", "linked", cwd=tmp_path)
    assert "traces, unreadable: out/probe is a symbolic link" in (tmp_path / "linked" / "report.html").read_text()


def test_a_restart_from_scratch_is_not_called_a_resume(tmp_path):
    """A deterministic script that ignores its checkpoint writes the same outputs after a stop: only the
    probe tells that nothing resumed, and the check is void, not a pass."""
    proc, result = check(tmp_path, *OUTPUTS, "--at-line", "saved", command=[*NUMPY, "--save-rng", "--from-scratch"])
    assert proc.returncode == 9 and result["verdict"] == "not-resumed", proc.stdout
    assert result["comparisons"]["resume"]["identical"] is True
    assert "stop 1: attempt 2 began again at step 1 (the probe)" in result["summary"]


def test_an_output_the_same_but_for_an_ignored_field_is_never_called_bit_identical(tmp_path):
    """Round 6's b6: with --ignore FILE:KEY the file is compared without the key, and its bytes differ
    (a wall time): the verdict says how it is the same, never "bit-identical"."""
    script = f"import json, os, time\n{RESUMES}json.dump({{'steps': 4, 'wall_s': time.time()}}, open('run.json', 'w'))"
    options = ("--output", "run.json", "--ignore", "run.json:wall_s", "--at", "0.8", "--stops", "1")
    proc, result = check(tmp_path, *options, command=[sys.executable, "-c", script])
    assert result["comparisons"]["resume"]["identical"] is True, proc.stdout + proc.stderr
    [entry] = result["comparisons"]["resume"]["files"]
    assert entry["sha256_a"] != entry["sha256_b"] and entry["ignored_fields"] == ["wall_s"], entry
    assert "bit-identical" not in result["summary"], result["summary"]
    assert (
        "identical to an uninterrupted run's (bit for bit but run.json: the same but for the fields"
        in result["summary"]
    ), result["summary"]
    assert (
        "0 of 1 files bit-identical, 1 the same but for ignored fields" in (tmp_path / "out" / "check.md").read_text()
    )
    from reprocube.results.check_result import read_check_page

    [page_entry] = read_check_page(tmp_path / "out" / "check.json")["files"]
    assert page_entry["same"] is True and page_entry["bytes_differ"] is True


def test_an_at_file_stop_on_a_fixed_name_says_why_it_did_not_land_again(tmp_path):
    """Round 7's F14: --at-file waits for a file no earlier attempt made, so a fixed name stops the first
    attempt only; the second stop's note says so, not only that the command ended first."""
    proc, result = check(tmp_path, *OUTPUTS, "--at-file", "ckpt.npz", "--stops", "2", command=[*NUMPY, "--save-rng"])
    assert result["verdict"] == "not-resumed", proc.stdout
    assert "an --at-file stop waits for a new file" in result["summary"], result["summary"]


def test_a_run_that_fails_beside_another_says_so(tmp_path):
    """Round 6's b17: a script that binds a fixed port (torchrun's MASTER_PORT) fails when the two clean runs
    go together; the verdict names the address in use and that --jobs 1 runs them one at a time."""
    script = (
        "import socket, time\ns = socket.socket(); s.bind(('127.0.0.1', 29517)); s.listen()\ntime.sleep(1.5)\n"
        "open('out.txt', 'w').write('1')"
    )
    proc, result = check(tmp_path, "--output", "out.txt", "--jobs", "2", command=[sys.executable, "-c", script])
    assert proc.returncode == 10 and result["verdict"] == "command-failed", proc.stdout
    assert "Address already in use" in result["summary"], result["summary"]
    assert "it ran beside another run (--jobs 2)" in result["summary"] and "--jobs 1" in result["summary"]


def test_a_script_that_writes_garbage_as_its_trace_is_not_checked_there(tmp_path):
    script = (
        "import os, time; open(os.environ['REPROCUBE_PROBE'], 'w').write('{\"probe\": 1}\\n[]\\n'); "
        f"\n{RESUMES}open('out.txt', 'w').write('1')"
    )
    proc, result = check(
        tmp_path, "--output", "out.txt", "--at", "0.8", "--stops", "1", command=[sys.executable, "-c", script]
    )
    # The outputs agree and the restart read its checkpoint, but with no readable trace nothing proves that
    # it applied it: not proven, never resume-exact.
    assert proc.returncode == 11 and result["verdict"] == "not-proven", proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    unread = [line for line in result["not_checked"] if "the probe's traces, unreadable" in line]
    assert len(unread) == 2 and "attempt-1.jsonl:2 is not a JSON object" in unread[0], result["not_checked"]
    assert "stop 1 shown by files only" in result["summary"]


def test_a_non_deterministic_script_is_never_called_a_resume_bug(tmp_path):
    proc, result = check(tmp_path, *OUTPUTS, command=[*NUMPY, "--random-seed", "--save-rng"])
    assert proc.returncode == 8 and result["verdict"] == "not-deterministic"
    assert "resume was not tested" in result["summary"] and "PYTHONHASHSEED" in result["summary"]
    assert "step 1 is the first update that differs" in result["summary"]
    assert [r["name"] for r in result["runs"]] == ["clean-1", "clean-2"]  # never stopped


def test_a_control_that_does_not_change_the_outputs_voids_the_check(tmp_path):
    proc, result = check(
        tmp_path, *OUTPUTS, "--seed-env", "SEED_NOT_READ_BY_THE_SCRIPT", command=[*NUMPY, "--save-rng"]
    )
    assert proc.returncode == 9 and result["verdict"] == "control-void"


def test_a_stop_that_never_lands_is_said_and_void(tmp_path):
    proc, result = check(tmp_path, *OUTPUTS, "--at", "300", "--stops", "1", command=[*NUMPY, "--save-rng"])
    assert proc.returncode == 9 and result["verdict"] == "no-stop-landed"
    assert any("no negative control" in line for line in result["not_checked"])


def test_the_default_stops_are_replayed_by_their_seed(tmp_path):
    """Moments spread over a clean run, jittered by the recorded seed: the same seed, the same moments."""
    args = [*OUTPUTS, "--seed-env", "SEED", "--stop-seed", "7", "--signal", "KILL"]
    command = [sys.executable, str(EXAMPLES / "numpy_sgd.py"), "--save-rng"]  # 8 epochs of 0.25 s
    proc, first = check(tmp_path, *args, command=command, name="a")
    assert proc.returncode == 0 and first["verdict"] == "resume-exact", proc.stdout
    assert first["stop_seed"] == 7 and first["stops"].count("after the attempt's first whole save") == 2
    _, again = check(tmp_path, *args, command=command, name="b")
    fractions = [re.findall(r"\((0\.\d+) of the time between two saves", r["stops"]) for r in (first, again)]
    assert len(fractions[0]) == 2 and fractions[0] == fractions[1]


def test_sigkill_in_the_middle_of_a_non_atomic_save_is_the_scripts_failure(tmp_path):
    proc, result = check(
        tmp_path,
        *OUTPUTS,
        "--signal",
        "KILL",
        "--stops",
        "1",
        "--at-file",
        "ckpt.npz",
        command=[*NUMPY, "--save-rng", "--non-atomic"],
    )
    assert proc.returncode == 10 and result["verdict"] == "command-failed", proc.stdout
    assert result["stage"] == "stopped" and "after 1 stop" in result["summary"]
    assert "Traceback" not in proc.stderr and "stopped exited 1" in result["summary"]


def test_a_failing_command_and_bad_options_are_one_line(tmp_path):
    proc, result = check(tmp_path, *OUTPUTS, command=[sys.executable, "-c", "raise SystemExit(3)"])
    assert proc.returncode == 10 and "clean-1 exited 3" in result["summary"]
    for args, message in (
        (["--output", "/etc"], "a path inside the work directory"),
        ([*OUTPUTS, "--repeat", "1"], "--repeat must be from 2 to 10"),
        ([*OUTPUTS, "--seed-arg=--seed"], "holds no {seed}"),
        ([*OUTPUTS, "--at-line", "("], "is not a regular expression"),
        ([*OUTPUTS, "--seed-env", "A=B"], "is not a variable name"),
        ([*OUTPUTS, "--stop-seed", "-5"], "--stop-seed must be from 0"),
    ):
        proc, _ = check(tmp_path, *args, name="refused")
        [line] = error_lines(proc)
        assert proc.returncode == 2 and message in line, line
    proc, _ = check(tmp_path, *OUTPUTS, command=[])
    assert proc.returncode == 2 and "no command to check" in error_lines(proc)[0]
    proc, result = check(tmp_path, *OUTPUTS, command=["/nonexistent/train"], name="missing")
    assert proc.returncode == 10 and "could not start '/nonexistent/train'" in result["summary"], proc.stderr


def test_an_output_that_cannot_be_read_is_not_checked_never_a_difference(tmp_path):
    """A FIFO among a directory's outputs (the same in every run): named as not compared; the verdict
    rests on the files compared."""
    script = (
        "import os, time; os.makedirs('out', exist_ok=True); open('out/a.txt', 'w').write('1'); "
        f"os.path.exists('out/pipe') or os.mkfifo('out/pipe')\n{RESUMES}"
    )
    proc, result = check(
        tmp_path, "--output", "out", "--at", "0.6", "--stops", "1", command=[sys.executable, "-c", script]
    )
    # What was compared is identical; the FIFO was not compared, and that (with the restart shown by its
    # files only) keeps the resume from being proven: never "every declared output is bit-identical".
    assert proc.returncode == 11 and result["verdict"] == "not-proven", proc.stdout
    assert "out/pipe not compared" in result["summary"] and "every declared output is" not in result["summary"]
    assert any(line.startswith("out/pipe in clean-2 against clean-1: not compared") for line in result["not_checked"])


def test_a_script_directory_with_its_check_yaml_is_checked_and_a_bad_one_is_one_line(tmp_path):
    """--script-dir (what `mlcube run --task=check` runs): DIR's files copied into each work directory,
    DIR/check.yaml read strictly for the command and the options."""
    script = tmp_path / "script"
    script.mkdir()
    (script / "numpy_sgd.py").write_bytes((EXAMPLES / "numpy_sgd.py").read_bytes())
    options = {
        "command": [sys.executable, "numpy_sgd.py", "--epochs", "3", "--sleep", "0.1", "--save-rng"],
        "output": ["final.npz"],
        "stops": 1,
        "at_line": "saved",
        "seed_env": "SEED",
    }
    (script / "check.yaml").write_text(json.dumps(options))  # YAML is a superset of JSON
    proc = reprocube("check", "--script-dir", "script", "--out", "out", cwd=tmp_path, check=False)
    result = json.loads((tmp_path / "out" / "check.json").read_text())
    assert proc.returncode == 0 and result["verdict"] == "resume-exact", proc.stdout
    assert result["command"] == options["command"] and result["stops"].count("saved") == 1
    for text, message in (
        ("command: python", "command must be a list of strings"),
        ('{"command": ["x"], "output": ["y"], "hack": 1}', "'hack' is not an option of check"),
        ('{"command": ["x"], "output": ["y"], "stops": "2"}', "stops must be an integer"),
        ('{"command": ["x"], "output": ["y"], "stops": true}', "stops must be an integer"),
        ('{"output": ["y"]}', "command is missing"),
        ("[1]", "must be a mapping"),
        ("&a [*a]", "alias"),
    ):
        (script / "check.yaml").write_text(text)
        proc = reprocube("check", "--script-dir", "script", "--out", "refused", cwd=tmp_path, check=False)
        [line] = error_lines(proc)
        assert proc.returncode == 2 and message in line, (text, line)
    proc = reprocube("check", "--script-dir", "script", "--out", "refused", "--stops", "3", cwd=tmp_path, check=False)
    assert proc.returncode == 2 and "give --stops in check.yaml" in error_lines(proc)[0]
    (script / "check.yaml").write_text(json.dumps(options))
    (script / "leak").symlink_to("/etc/hostname")  # copied into evidence that travels: refused
    proc = reprocube("check", "--script-dir", "script", "--out", "refused", cwd=tmp_path, check=False)
    assert proc.returncode == 2 and "script/leak: a symbolic link" in error_lines(proc)[0]
    assert not (tmp_path / "refused").exists()


def test_ctrl_c_ends_the_script_and_says_where_the_evidence_is(tmp_path):
    pid_file = tmp_path / "pid"
    script = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(60)"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "reprocube",
            "check",
            "--out",
            str(tmp_path / "out"),
            *OUTPUTS,
            "--",
            sys.executable,
            "-c",
            script,
        ],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # Ctrl-C's default in check: a suite started in the background (`make test &`) ignores SIGINT, and
        # Python keeps an ignored SIGINT ignored (CI on this machine waited 60 s for check to end)
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    wait_until(pid_file.exists, timeout=60, what="the script to start", process=proc)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and f"the evidence so far is in {tmp_path / 'out'}" in out, out + err
    with pytest.raises(ProcessLookupError):
        os.kill(int(pid_file.read_text()), 0)


@pytest.mark.parametrize("save_rng, verdict", [(False, "resume-differs"), (True, "resume-exact")])
def test_the_pytorch_example_its_bug_and_its_fix(tmp_path, save_rng, verdict):
    command = [sys.executable, str(EXAMPLES / "pytorch_mlp.py"), *(["--save-rng"] if save_rng else [])]
    proc, result = check(
        tmp_path, "--output", "model.pt", "--output", "metrics.csv", "--at-line", "saved", command=command
    )
    assert result["verdict"] == verdict, proc.stdout + proc.stderr
    traced = result["probe"]["resume"]
    if not save_rng:
        model = next(f for f in result["comparisons"]["resume"]["files"] if f["path"] == "model.pt")
        assert model["tensor"]["tensor"] in {"0.weight", "0.bias", "3.weight", "3.bias"}, model
        # The probe: the first update after the first stop (epoch 1 = 32 steps) already differs.
        first = traced["first_difference"]
        assert (first["step"], first["after_stop"], traced["attempts"][1]["how"]) == (33, 1, "assumed")
    else:
        assert traced["first_difference"] is None and traced["compared_steps"] == traced["reference_steps"] == 192


def test_the_one_line_probe_places_every_restart_by_its_bits(tmp_path):
    """Issue 66 item 7: the PyTorch example with `probe.watch(optimizer, model)` in place of its two probe
    calls (and no checkpoint announced): each restart is placed by its first update's bits, and all 192
    updates are compared, as with the two calls."""
    source = (EXAMPLES / "pytorch_mlp.py").read_text()
    one_line = source.replace(
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)",
        "optimizer = probe.watch(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), model)",
    )
    one_line = one_line.replace("        probe.step(loss, model)\n", "").replace(
        "    probe.checkpoint((epoch + 1)", "    ((epoch + 1)"
    )
    assert one_line.count("probe.") == 1
    (tmp_path / "train.py").write_text(one_line)
    command = [sys.executable, str(tmp_path / "train.py"), "--save-rng"]
    proc, result = check(
        tmp_path, "--output", "model.pt", "--output", "metrics.csv", "--at-line", "saved", command=command
    )
    assert result["verdict"] == "resume-exact", proc.stdout + proc.stderr
    traced = result["probe"]["resume"]
    assert [a["how"] for a in traced["attempts"]] == ["first", "matched", "matched"], traced["attempts"]
    assert traced["first_difference"] is None and traced["compared_steps"] == traced["reference_steps"] == 192


@pytest.mark.parametrize("reseed, verdict", [(True, "resume-differs"), (False, "resume-exact")])
def test_the_flax_orbax_example_its_bug_and_its_fix(tmp_path, reseed, verdict):
    """Orbax checkpoints are compared by their tensors (their bytes never agree), and the JAX probe names
    the first update after the first stop when the script takes a fresh key at every start."""
    command = [sys.executable, str(EXAMPLES / "flax_orbax.py"), "--epochs", "3", *(["--reseed"] if reseed else [])]
    proc, result = check(
        tmp_path, "--output", "final", "--output", "metrics.csv", "--at-line", "saved", "--stops", "1", command=command
    )
    assert result["verdict"] == verdict, proc.stdout + proc.stderr
    final = next(f for f in result["comparisons"]["resume"]["files"] if f["path"] == "final")
    traced = result["probe"]["resume"]
    if reseed:
        assert final["tensor"]["tensor"].startswith("layers_") and final["tensor"]["max_ulp"] > 0, final
        assert (traced["first_difference"]["step"], traced["first_difference"]["after_stop"]) == (33, 1)
    else:
        assert final == {"path": "final", "same": True, "detail": None, "tensors": 4}
        assert traced["compared_steps"] == traced["reference_steps"] == 96
        assert "resumed at step 32 (its first update is that step's)" in (tmp_path / "out" / "check.md").read_text()


def test_diff_names_the_first_differing_tensor(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    weights = {"w": np.arange(6, dtype=np.float32), "v": np.ones(2, np.float32)}
    np.savez(a / "ckpt.npz", **weights)
    np.savez(b / "ckpt.npz", **{**weights, "w": np.nextafter(weights["w"], np.float32(9))})
    (a / "log.txt").write_text("same\n"), (b / "log.txt").write_text("same\n")
    proc = reprocube("diff", str(a), str(b), cwd=tmp_path, check=False)
    assert proc.returncode == 6 and "ckpt.npz: tensor w: max abs" in proc.stdout and "max 1 ULP" in proc.stdout
    assert "differs in 1 of 2 files" in proc.stdout
    assert reprocube("diff", str(a / "log.txt"), str(b / "log.txt"), cwd=tmp_path, check=False).returncode == 0


def test_keras_backup_and_restore_resumes_at_the_epoch_but_not_the_same_training(tmp_path):
    """Measured (docs/check.md): Keras 3's BackupAndRestore restores the weights, the optimizer and the
    epoch, but not the generators behind the shuffling and the dropout: the resumed epochs train otherwise,
    and the history of the epochs before the restart is gone."""
    proc, result = check(
        tmp_path,
        "--output",
        "model.weights.h5",
        "--output",
        "history.csv",
        "--at-line",
        "saved",
        command=[sys.executable, str(EXAMPLES / "keras_fit.py")],
    )
    assert result["verdict"] == "resume-differs", proc.stdout + proc.stderr
    files = {f["path"]: f for f in result["comparisons"]["resume"]["files"]}
    assert files["model.weights.h5"]["tensor"]["tensor"].startswith("layers/")
    assert "line 1:" in files["history.csv"]["detail"]  # the first epochs' losses are not in the history
    assert (tmp_path / "out" / "logs" / "stopped.log").read_text().count("epoch 3 saved") == 1
    # The probe's Keras callback (TensorFlow weights): the first update after the first stop departs.
    first = result["probe"]["resume"]["first_difference"]
    assert (first["step"], first["after_stop"]) == (33, 1) and first["tensors"], first


def test_a_long_run_is_never_silent_on_any_output(tmp_path, monkeypatch):
    """Issue 39: a progress line while a run goes on (every 30 s; a fraction of a second here), whatever
    the output is: the run, its seconds, the command's newest line."""
    from reprocube.check import runs as check_runs
    from reprocube.check.options import CheckOptions
    from reprocube.check.session import check as check_command

    monkeypatch.setattr(check_runs, "PROGRESS_EVERY_S", 0.3)
    lines = []
    options = CheckOptions.of(
        command=[*NUMPY, "--save-rng"], output=["final.npz"], stops=1, at_line="saved", out=tmp_path / "out"
    )
    result = check_command(options, echo=lines.append)
    assert result["verdict"] == "resume-exact"
    progress = [
        line for line in lines if re.fullmatch(r"  clean-1: \d+ s, running; (its last line: .*|no output yet)", line)
    ]
    assert progress, lines


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--slurm-option=-p gpu"], "give sbatch's long form"),
        (["--slurm-option=--output=/elsewhere"], "--output is check's own or breaks its jobs"),
        (["--slurm-option=--outp=/elsewhere"], "--output is check's own"),  # sbatch takes a prefix
        (["--slurm-option=--test-only"], "--test-only is check's own or breaks its jobs"),
        (["--signal", "KILL"], "--signal cannot be chosen"),
    ],
)
def test_launcher_slurm_refuses_options_it_cannot_honour_before_anything_runs(tmp_path, options, message):
    """Nothing is submitted, nothing written: one line, exit 2 (no SLURM needed)."""
    proc = reprocube(
        "check",
        "--launcher",
        "slurm",
        *options,
        "--output",
        "x",
        "--out",
        str(tmp_path / "out"),
        "--",
        "true",
        cwd=tmp_path,
        check=False,
    )
    assert proc.returncode == 2 and message in proc.stderr and len(error_lines(proc)) == 1, proc.stderr
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_the_slurm_batch_script_records_each_attempt_beside_the_output(tmp_path):
    """check_slurm's batch script, run by bash as SLURM would (no SLURM needed): the command's output, even
    one without a final newline or one that imitates a status line, never decides the exit status; each
    start's time and status go to files of their own, per SLURM_RESTART_COUNT; odd arguments stay one."""
    from reprocube.check.runs import Run
    from reprocube.check.slurm import _began, _ended, batch_script

    odd = 'it\'s $HOME `x` "q"\nline'
    command = [sys.executable, "-c", "import sys; print(sys.argv[1] == " + repr(odd) + ", end=''); sys.exit(3)", odd]
    run = Run("stopped", tmp_path / "work dir", tmp_path / "logs" / "stopped.log", {}, command, tmp_path / "probe")
    run.work.mkdir()
    (tmp_path / "logs" / "stopped.attempts").mkdir(parents=True)
    script = tmp_path / "batch.sh"
    script.write_text(batch_script(run))
    for restarts, expected in (("0", 1), ("1", 2)):
        done = subprocess.run(
            ["bash", str(script)], env={**os.environ, "SLURM_RESTART_COUNT": restarts}, capture_output=True, text=True
        )
        assert done.returncode == 3 and done.stdout == "True", done
        assert _ended(run, expected)[0] == 3 and _began(run, expected) <= _ended(run, expected)[1]
    assert _ended(run, 3) is None
