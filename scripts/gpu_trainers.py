"""The trainers' own resume on a GPU (issue 58): each row of docs/frameworks.md that fits one GPU, run with
`--device cuda` and the deterministic settings its trainer documents, checked by `reprocube check` and, at the
same time, its truth set up without reprocube as tests/test_frameworks.py sets it up (the example run
uninterrupted, and stopped by SIGTERM at the row's line and started again; the sha256 of the two weight
files). Writes OUT/trainers.json: one record per row, check's verdict beside the truth. Nothing is asserted
here: a lease's minutes are spent once, and the record says what was seen.

    python3 scripts/gpu_trainers.py OUT [ROW ...]"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from test_frameworks import EXAMPLES, Row, attempts, sha256, together  # noqa: E402

ONE_RANK = ("-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1")
CUDA = ("--device", os.environ.get("TRAINERS_DEVICE", "cuda"))  # cpu: a trial of this script here
# The CPU table's rows that fit one GPU, with --device cuda (torchrun: one process on the one GPU, NCCL).
ROWS = [
    Row("hf-trainer", "transformers", "hf_trainer.py", ("--epochs", "2", *CUDA), "model.safetensors",
        r"step 8 saved", 1, "", None),
    Row("lightning", "lightning", "lightning_fit.py", ("--epochs", "2", *CUDA), "model.safetensors",
        r"step 16 saved", 1, "", None),
    Row("lightning-save-rng", "lightning", "lightning_fit.py", ("--epochs", "2", "--save-rng", *CUDA),
        "model.safetensors", r"step 16 saved", 1, "", None),
    Row("lightning-save-rng-mid-epoch", "lightning", "lightning_fit.py", ("--epochs", "2", "--save-rng", *CUDA),
        "model.safetensors", r"step 8 saved", 1, "", None),
    Row("accelerate", "accelerate", "accelerate_loop.py", CUDA, "model.safetensors", r"step 8 saved", 1, "", None),
    Row("accelerate-seedable-sampler", "accelerate", "accelerate_loop.py", ("--seedable-sampler", *CUDA),
        "model.safetensors", r"step 8 saved", 1, "", None),
    Row("accelerate-seedable-sampler-rng-after-fetch", "accelerate", "accelerate_loop.py",
        ("--seedable-sampler", "--rng-after-fetch", *CUDA), "model.safetensors", r"step 8 saved", 1, "", None),
    Row("torchrun", "torch", "torchrun_ddp.py", CUDA, "model.safetensors", r"epoch 1 saved", 1, "", None),
    Row("torchrun-save-rng", "torch", "torchrun_ddp.py", ("--save-rng", *CUDA), "model.safetensors",
        r"epoch 1 saved", 1, "", None),
]  # fmt: skip


def command(row: Row) -> list[str]:
    launcher = ONE_RANK if row.script == "torchrun_ddp.py" else ()
    return [sys.executable, *launcher, str(EXAMPLES / row.script), *row.args]


def measure(row: Row, where: Path) -> dict:
    record: dict = {"row": row.name, "command": command(row)[1:], "at_line": row.at_line}
    where.mkdir(parents=True)
    started = time.monotonic()

    def truth(name: str, at_line: str | None, stops: int):
        statuses = attempts(command(row), where / "truth" / name, at_line, stops)
        return statuses, sha256(where / "truth" / name / row.output)

    def check():
        args = ["--output", row.output, "--at-line", row.at_line, "--stops", str(row.stops), "--jobs", "2"]
        return subprocess.run([sys.executable, "-m", "reprocube", "check", "--out", "check", *args, "--",
                               *command(row)], cwd=where, capture_output=True, text=True, timeout=420)  # fmt: skip

    try:
        (u_status, u_sha), (s_status, s_sha), proc = together(
            lambda: truth("uninterrupted", None, 0), lambda: truth("stopped", row.at_line, row.stops), check
        )
    except BaseException as error:  # noqa: B036 (an assertion of attempts: the truth could not be set up)
        record.update(error=f"{type(error).__name__}: {str(error)[-2000:]}")
        return record
    record.update(truth={"uninterrupted": u_sha, "stopped": s_sha, "exact": u_sha == s_sha,
                         "statuses": {"uninterrupted": u_status, "stopped": s_status}})  # fmt: skip
    record.update(check_exit=proc.returncode, check_tail=(proc.stdout + proc.stderr)[-3000:])
    result_path = where / "check" / "check.json"
    if result_path.is_file():
        result = json.loads(result_path.read_text())
        resume = result.get("probe", {}).get("resume", {})
        record.update(
            verdict=result.get("verdict"),
            first_difference=resume.get("first_difference"),
            compared_steps=resume.get("compared_steps"),
            reference_steps=resume.get("reference_steps"),
            ranks=resume.get("ranks"),
        )
        expected = "resume-exact" if record["truth"]["exact"] else "resume-differs"
        record["agrees_with_truth"] = record["verdict"] == expected
    record["wall_s"] = round(time.monotonic() - started, 1)
    return record


def main() -> int:
    out = Path(sys.argv[1]).resolve()
    wanted = set(sys.argv[2:])
    rows = [row for row in ROWS if not wanted or row.name in wanted]
    os.environ.setdefault("PYTHONHASHSEED", "0")
    records = together(*[lambda row=row: measure(row, out / row.name) for row in rows])
    (out / "trainers.json").write_text(json.dumps(records, indent=1))
    for r in records:
        print(r["row"], r.get("verdict"), "truth exact" if r.get("truth", {}).get("exact") else "truth differs",
              "agrees" if r.get("agrees_with_truth") else "DISAGREES or failed", r.get("first_difference"),
              r.get("error", ""), f"{r.get('wall_s')} s")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
