"""check's modes beside the whole check. `--quick` (issue 66 item 5), the edit-and-check loop: one
uninterrupted run and the stopped run (one stop by default), no second uninterrupted run before the stops, no
negative control, no restart given another run's state; a difference is still checked against more
uninterrupted runs. `--during-save` (item 2): each stop while a save is being written after a whole one. Their
verdicts against the truth are cells of the ground-truth matrix (tests/check/test_ground_truth.py, placements
quick-* and during-save), their words rows of the verdict table; here: their options, and what they run."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from reprocube.check.options import OPTIONS, CheckOptions, validate
from reprocube.check.verdict_words import QUICK_LEFT_OUT
from reprocube.commands.check import _options_from
from reprocube.errors import ConfigError

from helpers import reprocube

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
NUMPY = [sys.executable, str(EXAMPLES / "numpy_sgd.py"), "--epochs", "4", "--sleep", "0.1"]


def options(**values) -> CheckOptions:
    return CheckOptions.of(command=("python", "train.py"), output=("model.pt",), **values)


def test_quick_takes_one_uninterrupted_run_and_one_stop_unless_told_more_stops():
    assert (options().repeat, options().stops, options().quick) == (2, 2, False)
    assert (options(quick=True).repeat, options(quick=True).stops) == (1, 1)
    assert options(quick=True, stops=3).stops == 3
    validate(options(quick=True, stops=3))
    with pytest.raises(ConfigError, match="--quick runs one uninterrupted run: leave out --repeat"):
        validate(options(quick=True, repeat=3))
    with pytest.raises(ConfigError, match="--repeat must be from 2 to 10"):
        validate(options(repeat=1))


def test_during_save_stops_once_by_default_and_is_a_placement_of_its_own():
    assert (options(during_save=True).stops, options(during_save=True).repeat) == (1, 2)
    for placement in ({"at": "1.5"}, {"at_file": "*.pt"}, {"at_line": "saved"}):
        with pytest.raises(
            ConfigError, match="give at most one of --at, --at-file, --at-line, --during-save and --sweep"
        ):
            validate(options(during_save=True, **placement))
    with pytest.raises(ConfigError, match="--during-save places stops from the files"):
        validate(options(during_save=True, launcher="slurm"))


def test_check_yaml_takes_quick_as_true_or_false(tmp_path):
    script = tmp_path / "script"
    script.mkdir()
    given = {"command": [], "copy": [], **{o.name: [] if o.kind is list else o.default for o in OPTIONS}}
    (script / "check.yaml").write_text(json.dumps({"command": ["python", "t.py"], "output": ["m"], "quick": True}))
    assert _options_from(script, given, tmp_path / "out")["quick"] is True
    for bad in ('"yes"', "1"):
        (script / "check.yaml").write_text(f'{{"command": ["python"], "output": ["m"], "quick": {bad}}}')
        with pytest.raises(ConfigError, match="quick must be true or false"):
            _options_from(script, given, tmp_path / "out")


@pytest.mark.process
def test_a_quick_check_runs_one_uninterrupted_run_and_the_stopped_run_and_says_what_it_left_out(tmp_path):
    """A correct script (its generator saved): resume-exact from two runs, though it takes a seed (no control);
    the pass names first what --quick left out, and check.json says it was quick."""
    command = [*NUMPY, "--save-rng"]
    proc = reprocube(
        "check", "--quick", "--out", "out", "--output", "final.npz", "--seed-env", "SEED", "--at-line", "saved",
        "--", *command, cwd=tmp_path, check=False, timeout=300,
    )  # fmt: skip
    result = json.loads((tmp_path / "out" / "check.json").read_text())
    assert proc.returncode == 0 and result["verdict"] == "resume-exact", proc.stdout + proc.stderr
    assert [run["name"] for run in result["runs"]] == ["clean-1", "stopped"]
    assert result["quick"] is True and result["not_checked"][0] == QUICK_LEFT_OUT
    assert "not checked: --quick: one uninterrupted run" in result["summary"]
    assert "1 clean run, 1 stop by SIGTERM (--quick" in proc.stdout
    stopped = result["runs"][1]
    assert stopped["stops_landed"] == 1 and len(stopped["attempts"]) == 2


@pytest.mark.process
def test_a_quick_check_of_a_failing_command_never_says_it_ran_beside_another(tmp_path):
    """--quick runs its uninterrupted run alone: the --jobs hint of a failure that two runs at once can cause
    (a fixed port) would be false there."""
    proc = reprocube(
        "check", "--quick", "--out", "out", "--output", "x", "--", sys.executable, "-c", "raise SystemExit(3)",
        cwd=tmp_path, check=False, timeout=120,
    )  # fmt: skip
    result = json.loads((tmp_path / "out" / "check.json").read_text())
    assert proc.returncode == 10 and "clean-1 exited 3" in result["summary"], result["summary"]
    assert "ran beside another run" not in result["summary"], result["summary"]
