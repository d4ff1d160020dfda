"""verify.json and verify.md (`reprocube verify`, written beside the reference run it trained): the
schema, the writer (with what the checks prove) and the strict reader `reprocube report` uses."""

from __future__ import annotations

from pathlib import Path

from reprocube.results.schema import ResultFile
from reprocube.results.subject import read_run_subject

VERIFY_RESULT = ResultFile(
    "verify.json",
    version=1,
    keys=(
        "subject",  # the reference's final epoch checkpoint: report shows the checks only for that run
        "framework",
        "passed",
        "mode",  # linear or full
        "jobs",
        "launcher",
        "tolerance",
        "known_not_to_resume",
        "wall_s",
        "checks",  # [{name, check, passed, summary, detail}]
        "processes",
    ),
)


def write_verify(result: dict, directory: Path) -> Path:
    return VERIFY_RESULT.write(directory, result, markdown(result))


def read_verify(path: Path) -> dict:
    """A verify.json's checks (check, passed, summary) and subject (None: written before verify recorded one)."""
    verdict = VERIFY_RESULT.read(path)
    checks = [
        {"check": c.text("check"), "passed": c.boolean("passed"), "summary": c.text("summary")}
        for c in verdict.records("checks")
    ]
    subject = None if verdict.value.get("subject") is None else read_run_subject(verdict.mapping("subject"))
    return {"checks": checks, "subject": subject}


def markdown(result: dict) -> str:
    lines = [
        f"# reprocube verify: {result['framework']}",
        "",
        f"Verdict: **{'passed: bit-identical' if result['passed'] else 'FAILED'}**",
    ]
    if result["tolerance"]:
        lines.append(f"(explicit tolerance: max abs difference <= {result['tolerance']})")
    if result.get("known_not_to_resume"):
        lines += ["", f"Note: {result['known_not_to_resume']}"]
    where = "SLURM jobs" if result["launcher"] == "slurm" else f"{result['jobs']} at a time"
    lines += ["", f"Mode: {result['mode']}; checks run as {where}; wall-clock {result['wall_s']} s", ""]
    lines += [WHAT_LINEAR_PROVES if result["mode"] == "linear" else WHAT_FULL_PROVES, ""]
    lines += ["| check | passed | result |", "|---|---|---|"]
    lines += [f"| {c['check']} | {'yes' if c['passed'] else '**no**'} | {c['summary']} |" for c in result["checks"]]
    return "\n".join(lines) + "\n"


WHAT_LINEAR_PROVES = """What this proves. Each link is a fresh process: the first trains from scratch to the reference's
first checkpoint, each other one starts from the reference's checkpoint k-1 and trains to checkpoint k.
A link passes only if its checkpoint k equals the reference's in every byte of the weights, the optimizer
state and every RNG, and every step's loss bits and the epoch records agree. Why that suffices: if every
link reproduces its checkpoint, then by induction on k a run restarted from scratch and a run resumed at
any checkpoint reproduce the uninterrupted run, since each step from k-1 to k is shown to be a function
of what checkpoint k-1 holds and of nothing else. A state a checkpoint fails to save or to restore (an
RNG, the momentum, the data position) was carried by the reference and not by the link, which then
differs. The link stopped by a real SIGTERM mid-epoch proves the same for a mid-epoch checkpoint. The
negative control (another seed) must differ, or the comparison could not see a difference at all.
Not shown by the links: a resumed process that trains on past its next checkpoint (each link stops
there); verify.full=true resumes from every checkpoint to the end."""


WHAT_FULL_PROVES = """What this proves. Every check compares a fresh process with the uninterrupted reference at every
checkpoint both hold: a whole restart, a resume from every epoch checkpoint to the end, the SIGTERM run,
and a whole run with another seed, which must differ (else the comparison could not see a difference)."""
