"""Differences check must not blame on the resume (round 10), each checked by a real `reprocube check` beside
its truth set up without reprocube:

- a script whose outputs vary from one process to the next, where the two uninterrupted runs happened to
  agree: more uninterrupted runs, started because the stopped run differs, show it (not-deterministic);
- a script that records its HOME and temporary directory: the runs differ only in the directories check
  gives each, and the verdict says so instead of the usual suspects;
- a torch.save file whose every value is the same but whose bytes differ (pickle's memo shares a key string
  in one process and not in another): a layout difference, never resume-differs."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from helpers import reprocube

pytestmark = pytest.mark.process  # every test here starts a process: not in make test-quick

EXIT = {"resume-exact": 0, "resume-differs": 6, "not-deterministic": 8, "not-resumed": 9, "not-proven": 11}


def check(tmp_path: Path, source: str, *options: str) -> dict:
    (tmp_path / "train.py").write_text(textwrap.dedent(source).lstrip())
    command = ["check", "--out", "out", "--copy", "train.py", *options, "--", sys.executable, "train.py"]
    proc = reprocube(*command, cwd=tmp_path, check=False, timeout=300)
    result = json.loads((tmp_path / "out" / "check.json").read_text())
    assert EXIT[result["verdict"]] == proc.returncode, (result["verdict"], proc.returncode, proc.stdout)
    return result


def run_in(directory: Path, source: str, env: dict | None = None) -> bytes:
    """The script run to its end in a fresh directory, without reprocube: its final.npy's bytes."""
    directory.mkdir(parents=True)
    (directory / "train.py").write_text(textwrap.dedent(source).lstrip())
    subprocess.run([sys.executable, "train.py"], cwd=directory, check=True, env={**os.environ, **(env or {})})
    return (directory / "final.npy").read_bytes()


def said(result: dict) -> str:
    return f"{result['verdict']}: {result['summary']}"


# A process's own choice, made deterministic for the test: the runs named clean-1 and clean-2 happen to
# agree, every other process (the stopped run's, a third uninterrupted run's) takes the other branch. What
# per-process non-determinism (a set's order under hash randomisation) does by chance.
PER_PROCESS = """
    import os, pickle, time
    import numpy as np
    lucky = os.path.basename(os.getcwd()) in ("clean-1", "clean-2")
    w, start = np.zeros(4), 0
    if os.path.exists("ckpt.pkl"):
        w, start = pickle.load(open("ckpt.pkl", "rb"))
    for step in range(start, 8):
        time.sleep(0.1)
        w = w + (1.0 if lucky else 1.5) * (step + 1)
        pickle.dump((w, step + 1), open("ckpt.tmp", "wb"))
        os.replace("ckpt.tmp", "ckpt.pkl")
        print(f"step {step} saved", flush=True)
    np.save("final.npy", w)
"""


def test_a_difference_more_uninterrupted_runs_show_too_is_not_blamed_on_resume(tmp_path):
    # The truth: two uninterrupted runs of the script in other directories give other outputs.
    truth = {run_in(tmp_path / "truth" / name, PER_PROCESS) for name in ("clean-1", "clean-3")}
    assert len(truth) == 2
    result = check(tmp_path, PER_PROCESS, "--output", "final.npy", "--stops", "1")
    assert result["verdict"] == "not-deterministic", said(result)
    assert result["rule"] == "differs_per_process" and "2 more uninterrupted runs" in result["summary"], said(result)
    assert {r["name"] for r in result["runs"]} >= {"clean-3", "clean-4"}


RECORDS_HOME = """
    import json, os, pickle, tempfile, time
    import numpy as np
    w, start = np.zeros(4), 0
    if os.path.exists("ckpt.pkl"):
        w, start = pickle.load(open("ckpt.pkl", "rb"))
    json.dump({"home": os.path.expanduser("~"), "tmp": tempfile.gettempdir(), "lr": 0.1}, open("config.json", "w"))
    for step in range(start, 6):
        time.sleep(0.1)
        w = w + 0.1 * (step + 1)
        pickle.dump((w, step + 1), open("ckpt.tmp", "wb"))
        os.replace("ckpt.tmp", "ckpt.pkl")
    np.save("final.npy", w)
"""


def test_a_difference_only_in_checks_own_home_and_tmpdir_is_named_so(tmp_path):
    # The truth: the same HOME and TMPDIR give the same outputs; other ones other config.json.
    same = {"HOME": str(tmp_path), "TMPDIR": str(tmp_path)}
    assert run_in(tmp_path / "truth" / "a", RECORDS_HOME, same) == run_in(tmp_path / "truth" / "b", RECORDS_HOME, same)
    assert (tmp_path / "truth" / "a" / "config.json").read_bytes() == (
        tmp_path / "truth" / "b" / "config.json"
    ).read_bytes()
    result = check(tmp_path, RECORDS_HOME, "--output", "final.npy", "--output", "config.json")
    assert result["verdict"] == "not-deterministic", said(result)
    assert result["rule"] == "clean_runs_differ_in_own_value", said(result)
    assert "HOME and TMPDIR check gives each run" in result["summary"] and "Usual suspects" not in result["summary"]


# Every value saved the same; in a restarted process the dictionary keys are built at run time, so pickle's
# memo no longer shares them with the names list: other bytes.
MEMO = """
    import os, pickle, time
    import numpy as np
    import torch
    resumed = os.path.exists("ckpt.pkl")
    w, start = (pickle.load(open("ckpt.pkl", "rb")) if resumed else (np.zeros(4, np.float32), 0))
    for step in range(start, 8):
        time.sleep(0.15)
        w = w + np.float32(0.25) * (step + 1)
        pickle.dump((w, step + 1), open("ckpt.tmp", "wb"))
        os.replace("ckpt.tmp", "ckpt.pkl")
        print(f"step {step} saved", flush=True)
    key = "".join(["wei", "ght"]) if resumed else "weight"
    torch.save({"names": ["weight"], "state": {key: torch.from_numpy(w)}}, "final.pt")
"""


def test_a_checkpoint_the_same_in_every_value_but_not_in_bytes_is_a_layout_difference(tmp_path):
    pytest.importorskip("torch")
    result = check(tmp_path, MEMO, "--output", "final.pt", "--stops", "1")
    # The truth: the stopped run's final.pt has other bytes, and every value torch.load reads is the same.
    import torch

    clean, stopped = (tmp_path / "out" / "work" / name / "final.pt" for name in ("clean-1", "stopped"))
    digests = {hashlib.sha256(path.read_bytes()).hexdigest() for path in (clean, stopped)}
    a, b = (torch.load(path, weights_only=True) for path in (clean, stopped))
    assert a["names"] == b["names"] and torch.equal(a["state"]["weight"], b["state"]["weight"])
    if len(digests) == 1:
        pytest.skip("this torch wrote the same bytes: no layout difference to judge")
    assert result["verdict"] != "resume-differs", said(result)
    assert "a layout difference" in result["summary"], said(result)
