"""A ground-truth matrix for `reprocube check` (issue 53, item 9), like the receipt mutation test: small
NumPy and PyTorch training scripts, generated here with one defect each (or none), crossed with where the
stops land. Each cell's truth is established inside the test without reprocube: the script run
uninterrupted twice and stopped-and-rerun by the test itself (SIGTERM to its process group when the same
marker line appears, or after the same delay, twice, then rerun to its end), each in a fresh directory,
its declared outputs by sha256; whether a checkpoint was on disk when each stop landed; where each
restart resumed (the scripts print `resumed at step K`). The assertion: check's verdict never says more
than that truth.

- `resume-exact` (exit 0) only where the uninterrupted runs agree, a restart truly resumed from state the
  stopped run itself saved, and the stopped-and-rerun outputs are byte-identical.
- `resume-differs` (6) only where the uninterrupted runs agree and the stopped-and-rerun outputs differ.
- `not-deterministic` (8) only for the non-determinism classes (seed from the clock, unordered iteration,
  a timestamp in an output) or where the uninterrupted runs differ.
- an `--output` the script never writes (a typo): an error naming it (exit 10, or 2 for a refused option).
- exits 9 and 10 say less (void, failed) and are always allowed, except for the correct script under the
  placements that do test resume (mid-epoch, right after a save, the default stops of the NumPy script,
  right after a save in PyTorch): there only `resume-exact` is (else a check that always says void would
  pass the matrix).

The allowed exits of every cell are in CELLS, with the truth each cell is built to have; the test checks
that the truth it establishes is that one (else the cell is the test's bug, not check's), and
test_the_table_allows_no_more_than_its_truth checks the table against the rules above.

The scripts (Script.source): logistic regression by SGD with momentum on a fixed dataset read through a
cursor, input dropout from a seeded generator (NumPy), or an MLP with dropout and SGD with momentum on batches
drawn by torch's generator (PyTorch); a checkpoint every 4 updates (2 in the long ones below) into the work
directory, written then renamed; `start` printed before the imports, `step N` after each update, `saved N`
after each save; the probe's two calls (reprocube.probe: nothing outside check); outputs final.npz (model.pt)
and metrics.csv. Defects: `rng` (the generator is not in the checkpoint), `optimizer` (the momentum is not),
`data-position` (the cursor is not), `ckpt-at-end` (saved only after the training), `outside` (the checkpoint
at a fixed absolute path outside the work directory, here under the test's tmp_path, and, as `rng`, without
the generator: what the leak from one run into the next hides; its scripts end with a 0.3 s evaluation, which
a start that resumes at the end runs too, so that stops land in it; `outside+no-probe`: the same script
without the probe's calls, as most scripts are), `clock-seed`, `unordered` (the features' order comes from
iterating a set of strings, run with PYTHONHASHSEED unset), `timestamp` (in metrics.csv), `fifo` and
`directory` (only after a restart, a FIFO or a directory where the model file would be, inside the declared
output directory `model`), `typo` (check is given `--output finale.npz`; the script writes final.npz). The
outside checkpoint leaks from one run into the next: the truth removes it before each of its runs, as an
honest fresh run would start.

Placements (PLACEMENTS), each with 2 stops as check's default: `startup` (at the `start` line, during the
imports), `before-ckpt` (at `step 1`: nothing saved yet), `mid-epoch` (at `step 6`, between the saves of
steps 4 and 8), `after-save` (at `saved`), `default` (no placement option: check's planned stops, with a
fixed --stop-seed so that a failure replays; the truth stops where check.json says check did: so many
seconds after the attempt started, or after its first save, taken as its first `saved` line). The NumPy
scripts of the default placement train 36 updates (0.9 s) and save every 2, so that such stops land after
a save; the PyTorch ones 12 (0.3 s): stops planned as a share of a clean run from the attempt's start land
during `import torch`, where the issue's false passes were, so the truth of those cells depends on where
check's planner puts them ("not resumed" or "differs"). Where check's second clean run resumed from the
first one's leaked checkpoint (`outside+no-probe`), its planned stops land within a few updates of the
start: that cell's truth may be "differs" or "not resumed". A cell's allowed exits are those of its table
row that the truth found allows.

Cells left out (what they would add is in a cell already): every placement of the non-determinism classes
but the default (check stops at its two clean runs, before any stop); every placement of the typo but one
(the same); `before-ckpt` and `startup` of the defects (like the correct script's, the stop leaves nothing
saved and the restart is a fresh run: shown for `none`, and for the PyTorch defects under the default
stops); `after-save` of `ckpt-at-end` (its only save follows the training: the stop interrupts nothing);
one of `mid-epoch` and `after-save` for the defects that a restart from any checkpoint shows the same
way (optimizer, data-position, fifo, directory, outside); PyTorch `rng` after a save (the PyTorch example
of tests/check/test_check_command.py is that cell), PyTorch `data-position`, `ckpt-at-end` and the rest (NumPy's show
them at a tenth of the cost: a PyTorch cell pays `import torch` in each of its 8 runs); a negative
control (--seed-env: one more run per cell, and control-void is a void verdict, always allowed).

Run alone: `.venv/bin/pytest -q tests/check/test_ground_truth.py -p no:randomly`: 200 s on this 2-CPU machine
while other work kept its load near 3, 250-275 s near 6-7; the three PyTorch cells are half of it."""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from string import Template

import pytest

from reprocube.results.check_result import VERDICTS

from helpers import reprocube

EXACT, DIFFERS, NOT_DETERMINISTIC, VOID, FAILED, REFUSED = 0, 6, 8, 9, 10, 2
NOT_PROVEN, LEAKED = 11, 12  # each says less than a pass or a difference, as a void verdict does
SAVE_INTERRUPTED = 13  # a stop landed during a save and the restart failed on what it left
SAID_LESS = frozenset({VOID, NOT_PROVEN, LEAKED, FAILED})
NON_DETERMINISM = {"clock-seed", "unordered", "timestamp", "rng-timestamp"}
STOPS = 2

PLACEMENTS = {
    "startup": ["--at-line", "^start$"],
    "before-ckpt": ["--at-line", "^step 1$"],
    "mid-epoch": ["--at-line", "^step 6$"],
    "after-save": ["--at-line", "^saved"],
    "default": ["--stop-seed", "3"],  # planned stops (0.30 and 0.34 of a clean run); the seed only replays them
    # check --quick: one uninterrupted run, one stop, no control and no restart given other state
    "quick-after-save": ["--quick", "--at-line", "^saved"],
    "quick-default": ["--quick", "--stop-seed", "3"],
    # while a save is written after a whole one; the truth stops 0.1 s after the script says so (between files)
    "during-save": ["--during-save"],
}
DURING_SAVE_LINE = "^saving after a whole one"

# The truths a cell can have (Truth.category), and what check may say there (the rules of the docstring).
RULES = {
    "exact": {EXACT} | SAID_LESS,  # the clean runs agree; a restart resumed; stopped-and-rerun is identical
    "differs": {DIFFERS} | SAID_LESS,  # the clean runs agree; stopped-and-rerun differs
    "not resumed": set(SAID_LESS),  # identical, but no restart resumed: the stops tested nothing
    "not deterministic": {NOT_DETERMINISTIC} | SAID_LESS,  # the uninterrupted runs differ
    "output never written": {REFUSED, FAILED},  # a declared output no run writes
    # a stop during a save left a checkpoint the restart cannot load: never a pass nor a difference
    "restart fails": {SAVE_INTERRUPTED} | SAID_LESS,
}

# fmt: off
CELLS = [
    # framework defect               placement       the truth                 exits check may give
    ("numpy",  "none",              "startup",      "not resumed",            SAID_LESS),
    ("numpy",  "none",              "before-ckpt",  "not resumed",            SAID_LESS),
    ("numpy",  "none",              "mid-epoch",    "exact",                  {EXACT}),
    ("numpy",  "none",              "after-save",   "exact",                  {EXACT}),
    ("numpy",  "none",              "default",      "exact",                  {EXACT}),
    ("numpy",  "rng",               "mid-epoch",    "differs",                {DIFFERS} | SAID_LESS),
    ("numpy",  "rng",               "after-save",   "differs",                {DIFFERS} | SAID_LESS),
    ("numpy",  "rng",               "default",      "differs",                {DIFFERS} | SAID_LESS),
    ("numpy",  "optimizer",         "after-save",   "differs",                {DIFFERS} | SAID_LESS),
    ("numpy",  "data-position",     "mid-epoch",    "differs",                {DIFFERS} | SAID_LESS),
    ("numpy",  "ckpt-at-end",       "mid-epoch",    "not resumed",            SAID_LESS),
    ("numpy",  "ckpt-at-end",       "default",      "not resumed",            SAID_LESS),
    ("numpy",  "outside",           "after-save",   "differs",                {DIFFERS} | SAID_LESS),
    ("numpy",  "outside",           "default",      "differs",                {DIFFERS} | SAID_LESS),
    ("numpy",  "outside+no-probe",  "default",      "differs | not resumed",  {DIFFERS} | SAID_LESS),
    ("numpy",  "clock-seed",        "default",      "not deterministic",      {NOT_DETERMINISTIC} | SAID_LESS),
    ("numpy",  "unordered",         "default",      "not deterministic",      {NOT_DETERMINISTIC} | SAID_LESS),
    ("numpy",  "timestamp",         "default",      "not deterministic",      {NOT_DETERMINISTIC} | SAID_LESS),
    ("numpy",  "fifo",              "after-save",   "differs",                {DIFFERS} | SAID_LESS),
    ("numpy",  "directory",         "after-save",   "differs",                {DIFFERS} | SAID_LESS),
    ("numpy",  "typo",              "after-save",   "output never written",   {REFUSED, FAILED}),
    ("numpy",  "folder-trusting",   "during-save",  "restart fails",          {SAVE_INTERRUPTED} | SAID_LESS),
    ("numpy",  "folder-validating", "during-save",  "exact",                  {EXACT}),
    ("numpy",  "folder-top",        "during-save",  "differs",                {DIFFERS} | SAID_LESS),
    ("numpy",  "none",              "quick-after-save", "exact",              {EXACT}),
    ("numpy",  "none",              "quick-default", "exact",                 {EXACT}),
    ("numpy",  "rng",               "quick-after-save", "differs",            {DIFFERS} | SAID_LESS),
    ("numpy",  "optimizer",         "quick-default", "differs",               {DIFFERS} | SAID_LESS),
    ("numpy",  "ckpt-at-end",       "quick-default", "not resumed",           SAID_LESS),
    ("numpy",  "clock-seed",        "quick-default", "not deterministic",     {NOT_DETERMINISTIC} | SAID_LESS),
    ("numpy",  "unordered",         "quick-default", "not deterministic",     {NOT_DETERMINISTIC} | SAID_LESS),
    ("numpy",  "rng-timestamp",     "quick-after-save", "not deterministic",  {NOT_DETERMINISTIC} | SAID_LESS),
    ("numpy",  "clock-seed+no-probe", "quick-after-save", "not deterministic", {NOT_DETERMINISTIC} | SAID_LESS),
    ("torch",  "none",              "after-save",   "exact",                  {EXACT}),
    ("torch",  "rng",               "default",      "not resumed | differs",  {DIFFERS} | SAID_LESS),
    ("torch",  "optimizer",         "default",      "not resumed | differs",  {DIFFERS} | SAID_LESS),
]
# fmt: on

# --- the scripts ------------------------------------------------------------------------------------------

NUMPY = Template("""\
print("start", flush=True)
import json, os, time
import numpy as np
from reprocube import probe

SEED = $seed
STEPS, EVERY, SLEEP = $steps, $every, $sleep
CKPT, MODEL = $ckpt, $model
data = np.random.default_rng(1234)  # the dataset is fixed
x = data.normal(size=(50, 8)).astype(np.float32)
y = (x @ data.normal(size=8) > 0).astype(np.float32)
if $unordered:  # the features' order from a set of strings: PYTHONHASHSEED's
    x = x[:, [int(name[1:]) for name in {"f%d" % i for i in range(8)}]]
w, v, step, cursor, losses, resumed = np.zeros(8, np.float32), np.zeros(8, np.float32), 0, 0, [], False
rng = np.random.default_rng(SEED)


FOLDER = "$folder"  # "": one file, written then renamed; else a folder of 3 files per save, written in place


def whole(folder):
    return all(os.path.exists(f"{folder}/{key}.npy") for key in ("w", "v", "meta"))


def save():
    state = {"w": w, "step": step, "losses": np.array(losses), "v": v, "cursor": cursor,
             "rng": np.array(json.dumps(rng.bit_generator.state))}
    for key in $unsaved:
        del state[key]
    if FOLDER:  # w, then v, then the rest: a stop between them leaves a partial folder (or, "top", a mixed one)
        after_whole = whole(".") or os.path.isdir("ckpt") and any(whole(f"ckpt/{d}") for d in os.listdir("ckpt"))
        print("saving after a whole one" if after_whole else "saving", flush=True)
        folder = "." if FOLDER == "top" else f"ckpt/step-{step:04d}"
        os.makedirs(folder, exist_ok=True)
        np.save(f"{folder}/w.npy", state.pop("w"))
        time.sleep(0.2)
        np.save(f"{folder}/v.npy", state.pop("v"))
        time.sleep(0.2)
        np.save(f"{folder}/meta.npy", np.array(json.dumps({k: np.asarray(x).tolist() for k, x in state.items()})))
    else:
        np.savez(CKPT + ".tmp.npz", **state)
        os.replace(CKPT + ".tmp.npz", CKPT)  # write then rename
    probe.checkpoint(step)
    print(f"saved {step}", flush=True)


folders = sorted(os.listdir("ckpt")) if FOLDER and os.path.isdir("ckpt") else []
folders = ["."] if FOLDER == "top" and whole(".") else folders  # "top": the three files in place, whatever their saves
if FOLDER == "validating":  # the newest folder holding every file; a partial one is passed over
    folders = [d for d in folders if whole(f"ckpt/{d}")]
if folders:  # "trusting": the newest folder, whatever it holds
    folder = "." if FOLDER == "top" else f"ckpt/{folders[-1]}"
    meta = json.loads(str(np.load(f"{folder}/meta.npy")))
    w, v, step, cursor = np.load(f"{folder}/w.npy"), np.load(f"{folder}/v.npy"), int(meta["step"]), int(meta["cursor"])
    losses, resumed = [float(f) for f in meta["losses"]], True
    rng.bit_generator.state = json.loads(meta["rng"])
    print(f"resumed at step {step}", flush=True)
elif not FOLDER and os.path.exists(CKPT):
    with np.load(CKPT) as ckpt:
        w, step, losses, resumed = ckpt["w"], int(ckpt["step"]), [float(f) for f in ckpt["losses"]], True
        v = ckpt["v"] if "v" in ckpt.files else v
        cursor = int(ckpt["cursor"]) if "cursor" in ckpt.files else cursor
        if "rng" in ckpt.files:
            rng.bit_generator.state = json.loads(str(ckpt["rng"]))
    print(f"resumed at step {step}", flush=True)

while step < STEPS:
    batch = (cursor + np.arange(8)) % len(x)
    cursor = (cursor + 8) % len(x)
    xb = x[batch] * (rng.random(8) > 0.2).astype(np.float32)  # dropout on the inputs
    p = 1 / (1 + np.exp(-xb @ w))
    v = np.float32(0.9) * v + (xb.T @ (p - y[batch]) / len(batch)).astype(np.float32)
    w = w - np.float32(0.5) * v
    step += 1
    losses.append(float(np.mean(np.abs(p - y[batch]))))
    probe.step(losses[-1], {"w": w}, step=step)
    print(f"step {step}", flush=True)
    time.sleep(SLEEP)
    if step % EVERY == 0 and not $at_end:
        save()
if $at_end:
    save()
time.sleep($evaluation)  # an evaluation, which a start that resumes at the end runs too

os.makedirs(os.path.dirname(MODEL) or ".", exist_ok=True)
if resumed and "$after_restart" == "fifo":
    os.mkfifo(MODEL)
elif resumed and "$after_restart" == "directory":
    os.makedirs(MODEL)
    np.save(os.path.join(MODEL, "w.npy"), w)
else:
    np.savez(MODEL, w=w)
with open("metrics.csv", "w") as file:
    if $timestamp:
        file.write(f"# written at {time.time()}\\n")
    file.writelines(f"{i + 1},{loss!r}\\n" for i, loss in enumerate(losses))
""")

TORCH = Template("""\
print("start", flush=True)
import os, time
import torch
from reprocube import probe

torch.manual_seed(int(os.environ.get("SEED", "0")))
torch.use_deterministic_algorithms(True)
torch.set_num_threads(1)
STEPS, EVERY, SLEEP, CKPT = $steps, $every, $sleep, $ckpt
data = torch.Generator().manual_seed(1234)  # the dataset is fixed
x = torch.randn(256, 16, generator=data)
y = (x @ torch.randn(16, generator=data) > 0).long()
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Dropout(0.2), torch.nn.Linear(32, 2))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
step, losses = 0, []
if os.path.exists(CKPT):
    state = torch.load(CKPT, weights_only=True)
    model.load_state_dict(state["model"])
    step, losses = state["step"], state["losses"]
    if "optimizer" in state:
        optimizer.load_state_dict(state["optimizer"])
    if "rng" in state:
        torch.set_rng_state(state["rng"])
    print(f"resumed at step {step}", flush=True)

while step < STEPS:
    batch = torch.randint(0, len(x), (32,))
    optimizer.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(x[batch]), y[batch])
    loss.backward()
    optimizer.step()
    step += 1
    losses.append(loss.item())
    probe.step(loss, model, step=step)
    print(f"step {step}", flush=True)
    time.sleep(SLEEP)
    if step % EVERY == 0:
        state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "rng": torch.get_rng_state(),
                 "step": step, "losses": losses}
        for key in $unsaved:
            del state[key]
        torch.save(state, CKPT + ".tmp")
        os.replace(CKPT + ".tmp", CKPT)  # write then rename
        probe.checkpoint(step)
        print(f"saved {step}", flush=True)

torch.save(model.state_dict(), "model.pt")
with open("metrics.csv", "w") as file:
    file.writelines(f"{i + 1},{loss!r}\\n" for i, loss in enumerate(losses))
""")


@dataclass(frozen=True)
class Script:
    framework: str
    defect: str
    placement: str
    outside: Path | None = None  # the `outside` defect's checkpoint

    @property
    def kind(self) -> str:
        """The defect class (`outside+no-probe`: the class `outside`, the script without the probe's calls)."""
        return self.defect.split("+")[0]

    @property
    def checkpoint(self) -> str:
        if self.outside is not None:
            return str(self.outside)
        if self.kind == "folder-top":
            return "meta.npy"
        if self.kind.startswith("folder"):
            return "ckpt"
        return "ckpt.pt" if self.framework == "torch" else "ckpt.npz"

    @property
    def outputs(self) -> list[str]:
        """What check is told to compare (and the truth hashes)."""
        if self.framework == "torch":
            return ["model.pt", "metrics.csv"]
        if self.kind in ("fifo", "directory"):
            return ["model", "metrics.csv"]
        return ["finale.npz" if self.kind == "typo" else "final.npz", "metrics.csv"]

    def env(self) -> dict[str, str]:
        """The environment of its runs, as tests/helpers.py's reprocube() gives check's."""
        env = {**os.environ, "PYTHONHASHSEED": "0"}
        env.pop("REPROCUBE_PROBE", None)  # the probe records nothing in the truth's runs
        if self.kind == "unordered":
            env.pop("PYTHONHASHSEED")
        return env

    def source(self) -> str:
        unsaved = {"rng": ["rng"], "outside": ["rng"], "optimizer": ["optimizer" if self.framework == "torch" else "v"]}
        unsaved["data-position"], unsaved["rng-timestamp"] = ["cursor"], ["rng"]
        sizes = {"steps": 16, "every": 4, "sleep": 0.02}
        if self.placement.endswith("default") and self.framework == "numpy" and self.kind not in NON_DETERMINISM:
            sizes = {"steps": 36, "every": 2, "sleep": 0.025}  # the planned stops land after a save
        if self.kind.startswith("folder"):
            sizes = {"steps": 12, "every": 4, "sleep": 0.02}  # 3 saves of 0.4 s each
        if self.framework == "torch":
            sizes = {"steps": 12, "every": 4, "sleep": 0.02}  # the planned stops land in `import torch`
            source = TORCH.substitute(sizes, ckpt=repr(self.checkpoint), unsaved=unsaved.get(self.kind, []))
        else:
            source = NUMPY.substitute(
                sizes,
                seed="time.time_ns() % 2**32" if self.kind == "clock-seed" else 'int(os.environ.get("SEED", "0"))',
                ckpt=repr(self.checkpoint),
                model=repr("model/final.npz" if self.kind in ("fifo", "directory") else "final.npz"),
                unordered=self.kind == "unordered",
                unsaved=unsaved.get(self.kind, []),
                at_end=self.kind == "ckpt-at-end",
                after_restart=self.kind,
                timestamp=self.kind in ("timestamp", "rng-timestamp"),
                evaluation=0.3 if self.kind == "outside" else 0,
                folder=self.kind.partition("-")[2] if self.kind.startswith("folder") else "",
            )
        if "+no-probe" in self.defect:  # its import and its two calls
            source = "\n".join(line for line in source.splitlines() if "probe" not in line) + "\n"
        return source


# --- the truth, without reprocube ------------------------------------------------------------------------


def digests(root: Path, outputs: list[str]) -> dict[str, str | None]:
    """Every declared output under `root` by sha256 (a directory: each entry under it; a FIFO as such;
    a missing output as None)."""
    found: dict[str, str | None] = {}
    for output in outputs:
        path = root / output
        entries = sorted(path.rglob("*")) if path.is_dir() and not path.is_symlink() else [path]
        for entry in entries:
            name = entry.relative_to(root).as_posix()
            if entry.is_fifo():
                found[name] = "a FIFO"
            elif entry.is_dir():
                found[name] = "a directory"
            elif entry.is_file():
                found[name] = hashlib.sha256(entry.read_bytes()).hexdigest()
            else:
                found[name] = None
    return found


def written(found: dict[str, str | None], output: str) -> bool:
    return any(d is not None for name, d in found.items() if name == output or name.startswith(output + "/"))


@dataclass
class Attempt:
    lines: list[str]
    exit: int
    stopped: bool  # the signal ended it
    seconds: float


@dataclass(frozen=True)
class Stop:
    """Where the truth stops an attempt: at the first output line matching `line`, `seconds` after the
    attempt started, or `seconds` after the first line matching `line` when both are given."""

    line: str | None = None
    seconds: float | None = None


def attempt(script: Path, cwd: Path, env: dict, stop: Stop | None) -> Attempt:
    """One start of the script in `cwd`; SIGTERM to its process group at `stop`, as check's own stops."""
    started = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, str(script)],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        process_group=0,
    )
    lines: list[str] = []
    sent, timers = threading.Event(), []

    def send() -> None:
        if not sent.is_set() and proc.poll() is None:
            sent.set()
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

    def read() -> None:
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            if stop is not None and stop.line is not None and not timers and re.search(stop.line, line):
                timers.append(threading.Timer(stop.seconds or 0.0, send))
                timers[0].start()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    timed = stop is not None and stop.line is None
    try:
        proc.wait(stop.seconds if timed else 120)
    except subprocess.TimeoutExpired:
        if not timed:
            proc.kill()
            raise
        send()
    exit_status = proc.wait(120)
    reader.join(10)
    for timer in timers:
        timer.cancel()
    return Attempt(lines, exit_status, exit_status == -signal.SIGTERM, time.perf_counter() - started)


@dataclass
class Truth:
    outputs: list[str]
    clean: list[dict]  # the uninterrupted runs' digests
    clean_seconds: float
    stopped: dict | None = None  # the stopped-and-rerun run's digests
    stopped_exit: int | None = None
    checkpoint_at_stop: list[bool] = field(default_factory=list)  # per stop that landed
    resumed_at: list[int | None] = field(default_factory=list)  # per restart: the step it resumed at

    @property
    def category(self) -> str:
        if not all(written(self.clean[0], output) for output in self.outputs):
            return "output never written"
        if self.clean[0] != self.clean[1]:
            return "not deterministic"
        if self.stopped is None:
            return "not stopped yet"
        if self.stopped_exit != 0:
            assert not all(self.checkpoint_at_stop), f"the truth's stopped-and-rerun run failed: {self}"
            return "restart fails"
        if self.stopped != self.clean[0]:
            return "differs"
        return "exact" if any(self.resumed_at) else "not resumed"

    def describe(self) -> str:
        if self.stopped is None:
            return f"uninterrupted runs {'agree' if self.clean[0] == self.clean[1] else 'differ'}: {self.clean}"
        same = "equal" if self.stopped == self.clean[0] else f"differ ({self.stopped} vs {self.clean[0]})"
        return (
            f"uninterrupted runs {'agree' if self.clean[0] == self.clean[1] else 'differ'}; "
            f"{len(self.checkpoint_at_stop)} stops landed, a checkpoint on disk at each: {self.checkpoint_at_stop}; "
            f"the restarts resumed at steps {self.resumed_at}; the stopped-and-rerun outputs {same}"
        )


def remove_outside(script: Script) -> None:
    if script.outside is not None:
        script.outside.unlink(missing_ok=True)


def uninterrupted(script: Script, path: Path, where: Path) -> tuple[list[dict], float]:
    """Two uninterrupted runs, each in a fresh directory (the outside checkpoint removed before each, as
    an honest fresh run would start): their digests, and the median seconds."""
    runs, seconds = [], []
    for i in (1, 2):
        cwd = where / f"clean-{i}"
        cwd.mkdir(parents=True)
        remove_outside(script)
        run = attempt(path, cwd, script.env(), None)
        assert run.exit == 0, f"the truth's clean run failed: {run.lines[-5:]}"
        runs.append(digests(cwd, script.outputs))
        seconds.append(run.seconds)
    return runs, statistics.median(seconds)


def whole_checkpoint(checkpoint: Path) -> bool:
    """A checkpoint file on disk; a checkpoint folder (the folder-* defects) with every save in it whole."""
    if not checkpoint.is_dir():
        return checkpoint.exists()
    return all(all((d / f"{key}.npy").exists() for key in ("w", "v", "meta")) for d in checkpoint.iterdir())


def stopped_and_rerun(script: Script, path: Path, cwd: Path, stops: list[Stop], truth: Truth) -> None:
    """The script stopped by SIGTERM at each of `stops` and started again after each, in one fresh
    directory, as check's stopped run; then run to its end."""
    cwd.mkdir(parents=True)
    remove_outside(script)
    checkpoint = cwd / script.checkpoint  # the outside one is absolute
    for number, stop in enumerate([*stops, None]):
        run = attempt(path, cwd, script.env(), stop)
        if number:
            found = [int(m.group(1)) for line in run.lines if (m := re.fullmatch(r"resumed at step (\d+)", line))]
            truth.resumed_at.append(found[0] if found else None)
        if not run.stopped:
            break
        truth.checkpoint_at_stop.append(whole_checkpoint(checkpoint))
    truth.stopped_exit = run.exit
    truth.stopped = digests(cwd, script.outputs)


def stops_of(script: Script) -> int:
    """How many stops check makes in the cell (check --quick, --during-save: one, their default)."""
    return 1 if script.placement.startswith("quick") or script.placement == "during-save" else STOPS


def planned_stops(result: dict, clean_seconds: float, count: int) -> list[Stop]:
    """The default stops where check placed them (check.json's `stops`: seconds after each attempt started,
    or after its first whole save, which the truth takes as its first `saved` line); if check never stopped the
    script, the nominal ones: a third of a clean run after each start."""
    stops = []
    for text in filter(None, result.get("stops", "").split("; ")):
        found = re.match(r"(\d+(?:\.\d+)?) s after the attempt(?:'s first (whole save)| started)", text)
        assert found, f"check.json's stop {text!r}: the test does not know how to place it"
        stops.append(Stop("^saved" if found.group(2) else None, float(found.group(1))))
    return stops or [Stop(seconds=clean_seconds / (count + 1))] * count


@pytest.fixture(scope="module")
def clean_truths(tmp_path_factory) -> dict:
    """The uninterrupted runs of each script text, once per module (they do not depend on the placement)."""
    return {"root": tmp_path_factory.mktemp("truth-clean")}


def establish_truth(script: Script, path: Path, cache: dict, where: Path, result: dict) -> Truth:
    key = (script.source(), script.kind == "unordered")
    if key not in cache:
        cache[key] = uninterrupted(script, path, cache["root"] / f"{len(cache)}")
    clean, seconds = cache[key]
    truth = Truth(script.outputs, clean, seconds)
    if truth.category in ("output never written", "not deterministic"):
        return truth  # decided: no stopped run can change it
    if script.placement.endswith("default"):
        stops = planned_stops(result, seconds, stops_of(script))
    elif script.placement == "during-save":
        stops = [Stop(line=DURING_SAVE_LINE, seconds=0.1)] * stops_of(script)
    else:
        stops = [Stop(line=PLACEMENTS[script.placement][-1])] * stops_of(script)
    stopped_and_rerun(script, path, where / "stopped", stops, truth)
    return truth


# --- the matrix -------------------------------------------------------------------------------------------

NAMES = {EXACT: "resume-exact", DIFFERS: "resume-differs", NOT_DETERMINISTIC: "not-deterministic"}
NAMES |= {VOID: "a void verdict", FAILED: "command-failed", REFUSED: "refused (bad options)"}
NAMES |= {NOT_PROVEN: "not-proven", LEAKED: "state-leaked", SAVE_INTERRUPTED: "save-interrupted"}


def test_the_table_allows_no_more_than_its_truth():
    """CELLS, against the rules: no exit beyond what its truth allows (not-deterministic also for the
    non-determinism classes); only resume-exact for the correct script where the placement tests resume."""
    effective = {("numpy", p) for p in ("mid-epoch", "after-save", "default", "quick-after-save", "quick-default")}
    effective |= {("torch", "after-save")}
    for framework, defect, placement, truth, allowed in CELLS:
        rules = set().union(*(RULES[t] for t in truth.split(" | ")))
        rules |= {NOT_DETERMINISTIC} if defect.split("+")[0] in NON_DETERMINISM else set()
        assert set(allowed) <= rules, (framework, defect, placement)
        if defect == "none" and (framework, placement) in effective:
            assert set(allowed) == {EXACT}, (framework, defect, placement)
    ids = [cell[:3] for cell in CELLS]
    assert len(set(ids)) == len(ids)


@pytest.mark.process
@pytest.mark.parametrize(
    ("framework", "defect", "placement", "expected", "allowed"), CELLS, ids=["-".join(cell[:3]) for cell in CELLS]
)
def test_check_never_says_more_than_the_truth(framework, defect, placement, expected, allowed, tmp_path, clean_truths):
    kind = defect.split("+")[0]
    outside = tmp_path / "outside-the-work-directory" / "ckpt.npz" if kind == "outside" else None
    if outside is not None:
        outside.parent.mkdir()
    script = Script(framework, defect, placement, outside)
    path = tmp_path / "train.py"
    path.write_text(script.source())
    env_extra = {"PYTHONHASHSEED": None} if kind == "unordered" else None
    declared = [arg for output in script.outputs for arg in ("--output", output)]
    proc = reprocube(
        "check", "--out", "out", *declared, *PLACEMENTS[placement], "--", sys.executable, str(path),
        cwd=tmp_path, check=False, timeout=300, env_extra=env_extra,
    )  # fmt: skip
    result_path = tmp_path / "out" / "check.json"
    result = json.loads(result_path.read_text()) if result_path.is_file() else {}
    said = proc.returncode
    if result:
        assert VERDICTS[result["verdict"]] == said, (result["verdict"], said)
    verdict = result.get("verdict", f"exit {said}")

    truth = establish_truth(script, path, clean_truths, tmp_path / "truth", result)
    assert truth.category in expected.split(" | "), (
        f"the cell's own truth is not what CELLS says (the test's bug, not check's): {truth.describe()}"
    )
    allowed = set(allowed) & (RULES[truth.category] | ({NOT_DETERMINISTIC} if kind in NON_DETERMINISM else set()))
    names = ", ".join(NAMES[e] for e in sorted(allowed))
    assert said in allowed, (
        f"check said {verdict} (exit {said}), more than the truth allows ({names}): "
        f"{truth.describe()}. check: {result.get('summary', proc.stderr.strip()[-500:])}"
    )
    if expected == "output never written":
        assert "finale.npz" in result.get("summary", "") + proc.stderr, "the error names the output"
