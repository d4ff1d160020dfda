"""`check --sweep N` (issue 66 item 3): one stopped run per save of the uninterrupted run, each stopped once
after that save, a verdict per save from check's one table. Its options here, and its verdicts against a
truth set up without reprocube: the script's own runs stopped by this test after each save, their final
weights' sha256 against an uninterrupted run's."""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from reprocube.check.options import CheckOptions, validate
from reprocube.check.sweep import SWEEP_LEFT_OUT
from reprocube.errors import ConfigError
from reprocube.results.check_result import markdown

from helpers import reprocube

SCRIPT = Path(__file__).resolve().parent / "scripts" / "restarts_the_epoch.py"


def options(**values) -> CheckOptions:
    return CheckOptions.of(command=("python", "train.py"), output=("model.pt",), **values)


def test_a_sweep_stops_each_of_its_runs_once_and_is_a_placement_of_its_own():
    assert (options(sweep=4).stops, options(sweep=4).repeat) == (1, 2)
    validate(options(sweep=20))
    for refused, message in [
        ({"sweep": 0}, "--sweep must be from 1 to 20 saves, got 0"),
        ({"sweep": 21}, "--sweep must be from 1 to 20 saves"),
        ({"sweep": 3, "stops": 2}, "--sweep stops each of its runs once, after its save: leave out --stops"),
        ({"sweep": 3, "quick": True}, "leave out --quick"),
        ({"sweep": 3, "launcher": "slurm"}, "--sweep places its stops from the files"),
        ({"sweep": 3, "at_line": "saved"}, "give at most one of --at, --at-file, --at-line, --during-save and --sweep"),
        ({"sweep": 3, "during_save": True}, "give at most one of"),
    ]:
        with pytest.raises(ConfigError, match=re.escape(message)):
            validate(options(**refused))


def test_check_md_has_a_row_per_save():
    line = {"save": 2, "run": "sweep-2", "stops_landed": 1, "saves_before_stop": 2, "tested_save": 2, "resumed_at": 2,
            "verdict": "resume-differs",
            "rule": "resume_differs", "first_difference": 3, "summary": "resume-differs: ..."}  # fmt: skip
    result = {
        "verdict": "resume-differs", "rule": "resume_differs", "summary": "resume-differs: after save 2 of 3",
        "command": ["python", "t.py"], "outputs": {"paths": ["final.npy"], "ignore": []}, "stops": "",
        "signal": "TERM", "stop_seed": 1, "not_checked": [], "probe": None, "runs": [], "comparisons": {},
        "sweep": [line, {**line, "save": 3, "run": "sweep-3", "saves_before_stop": None, "tested_save": None,
                         "resumed_at": None,
                         "first_difference": None,
                         "verdict": "resume-exact"}],
    }  # fmt: skip
    text = markdown(result)
    assert "| 2 | sweep-2 | 2 | 2 | resume-differs | 3 |" in text and "| 3 | sweep-3 |  |  | resume-exact |  |" in text


@pytest.mark.parametrize(
    "signal_s, before, missed",
    [
        (1.5, 1, None),  # between save 1 (1.0-1.2) and save 2: its own
        (3.1, 2, "save 1: the stop came after 2 whole saves, so what a restart from save 1 does was not tried"),
        (0.5, 0, "save 1: the stop came after 0 whole saves"),
        (None, None, "save 1: no stop was sent"),
    ],
)
def test_a_sweep_line_names_the_save_its_stop_came_after(tmp_path, signal_s, before, missed):
    """Counted by the files' own times, a whole save's files added up where they came apart into two saves
    (save 2's json before its update, its tmp file after): a stop meant for save 1 that came later is no
    line of save 1."""
    from reprocube.check.file_activity import Event, FileActivity, state_key
    from reprocube.check.runs import Attempt, Run
    from reprocube.check.sweep import SaveVerdict
    from reprocube.check.verdict import Verdict

    writes = [(1.0, "work/ckpt.tmp"), (1.2, "work/ckpt.json"), (3.0, "work/ckpt.tmp"), (3.05, "work/ckpt.json")]
    activity = FileActivity({"work": tmp_path})
    activity.events = [Event(at, "write", path, 64) for at, path in writes]
    activity.updates = (3.02,)  # an update between save 2's files: grouped apart once the run ended
    keys = frozenset(state_key(p) for p in ("work/ckpt.tmp", "work/ckpt.json"))
    run = Run("sweep-1", tmp_path, tmp_path / "log", {}, [], tmp_path / "probe", state=keys, save_keys=keys)
    run.activity, run.began = activity, 0.0
    run.attempts = [Attempt(0.0, 4.0, -15, signal_s=signal_s), Attempt(4.1, 2.0, 0)]
    judged = SaveVerdict(1, run, Verdict("resume-exact", "resume", "", "resume_exact"), {})
    assert judged.saves_before_stop() == before
    assert (judged.missed() or "").startswith(missed or "") and bool(judged.missed()) == bool(missed)


def _judged(*names: str):
    from reprocube.check.runs import Run
    from reprocube.check.sweep import SaveVerdict
    from reprocube.check.verdict import Verdict

    run = Run("sweep-1", Path("w"), Path("l"), {}, [], Path("p"))
    return [SaveVerdict(k, run, Verdict(name, "resume", "", name), {}) for k, name in enumerate(names, start=1)]


@pytest.mark.parametrize(
    "saves, chosen",
    [
        (("resume-exact", "resume-differs", "resume-exact"), 2),  # the first finding
        (("resume-exact", "resume-exact", "not-resumed"), 2),  # the last save's stop came after the last update
        (("not-resumed", "resume-exact", "resume-exact"), 3),  # the last exact one
        (("no-stop-landed", "not-resumed"), 1),  # every stop proved nothing: the first says so
        (("resume-exact", "command-failed", "resume-differs"), 2),
        (("not-resumed", "save-interrupted"), 2),
    ],
)
def test_the_checks_verdict_is_the_first_finding_else_the_last_exact_save(saves, chosen):
    from reprocube.check.sweep import chosen_save

    assert chosen_save(_judged(*saves)).save == chosen


@pytest.mark.parametrize(
    "resumed, tested, missed",
    [
        (6, 2, None),  # the checkpoint the script announced second: its own
        (8, 3, "save 2: its restart resumed at update 8, save 3 as the script announced its checkpoints"),
        (7, None, "save 2: its restart resumed at update 7, no checkpoint announced"),
    ],
)
def test_with_the_probe_a_line_is_the_save_its_restart_resumed_from(resumed, tested, missed):
    """A save is what the script announced (probe.checkpoint, the callbacks): the adversary's files that group
    otherwise (a folder written twice into, a file at some saves only, a thread finishing a save) made the
    files' count claim save 2 for a restart from save 3. The probe's resumed step places it."""
    [judged] = _judged("resume-exact")
    judged.save, judged.announced = 2, (4, 6, 8, 12)
    judged.result = {"probe_resume": {"attempts": [{"steps": 5}, {"steps": 7, "resumed_at": resumed}]}}
    assert judged.tested() == tested and judged.resumed_at() == resumed
    assert (judged.missed() or "").startswith(missed or "") and bool(judged.missed()) == bool(missed)


def _stopped_after(save: int | None, cwd: Path) -> str:
    """The script run in cwd, SIGTERM at its line 'saved SAVE' (None: never), then run again to its end: the
    final weights' sha256."""
    cwd.mkdir(parents=True)
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    env.pop("REPROCUBE_PROBE", None)
    for attempt in range(2 if save is not None else 1):
        proc = subprocess.Popen([sys.executable, str(SCRIPT)], cwd=cwd, env=env, stdout=subprocess.PIPE, text=True)
        for line in proc.stdout:
            if attempt == 0 and save is not None and line.strip() == f"saved {save}":
                proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        proc.stdout.close()
    return hashlib.sha256((cwd / "final.npy").read_bytes()).hexdigest()


@pytest.mark.process
def test_a_sweep_gives_each_save_the_verdict_its_truth_gives(tmp_path):
    """Exact after the epoch's end (save 3), differs after every mid-epoch save (1, 2, 4, 5): a line per save
    that never says more than the truth, and the check's verdict the first save's that differs."""
    saves = 5
    proc = reprocube(
        "check", "--sweep", str(saves), "--out", "out", "--output", "final.npy", "--",
        sys.executable, str(SCRIPT), cwd=tmp_path, check=False, timeout=600,
    )  # fmt: skip
    result = json.loads((tmp_path / "out" / "check.json").read_text())
    uninterrupted = _stopped_after(None, tmp_path / "truth" / "uninterrupted")
    truth = {k: _stopped_after(k, tmp_path / "truth" / f"save-{k}") == uninterrupted for k in range(1, saves + 1)}
    assert truth == {1: False, 2: False, 3: True, 4: False, 5: False}  # the script's bug, as the truth shows it
    lines = result["sweep"]
    assert [line["save"] for line in lines] == list(range(1, saves + 1)), proc.stdout + proc.stderr
    for line in lines:
        taken = line["tested_save"]  # its own save, unless its restart took another (said under not checked)
        missed = f"save {line['save']}: the stop came after"
        assert (taken != line["save"]) == any(n.startswith(missed) for n in result["not_checked"]), line
        assert line["stops_landed"] == 1 and line["resumed_at"] == taken == line["saves_before_stop"], line
        exact = truth[taken]  # never more than the truth of the save the restart took
        assert line["verdict"] == ("resume-exact" if exact else "resume-differs"), line
        # the first differing update: the restart's first, which trains the epoch's first batch again
        assert line["first_difference"] == (None if exact else taken + 1), line
    assert sum(line["tested_save"] == line["save"] for line in lines) >= 4, lines  # mostly where meant
    assert result["verdict"] == "resume-differs" and proc.returncode == 6, result["summary"]
    first = next(line for line in lines if line["verdict"] == "resume-differs")
    assert result["summary"].startswith(f"resume-differs: the stop after save {first['save']}"), result["summary"]
    assert result["not_checked"][0] == SWEEP_LEFT_OUT
    assert [run["name"] for run in result["runs"]][:7] == ["clean-1", "clean-2", *(f"sweep-{k}" for k in range(1, 6))]
    assert [line["chosen"] for line in lines] == [line is first for line in lines]
    page = reprocube("report", "out", "--out", "page", cwd=tmp_path)  # the check page: a row per save
    html = (tmp_path / "page" / "report.html").read_text()
    assert page.returncode == 0 and "Each save (--sweep)" in html and html.count("<td class='num'>") >= 3 * saves
    assert (tmp_path / "page" / "losses.png").is_file()  # the chosen save's run's traces beside clean-1's
    table = (tmp_path / "out" / "check.md").read_text()
    assert all(f"| {line['save']} | sweep-{line['save']} | {line['tested_save']} |" in table for line in lines)
