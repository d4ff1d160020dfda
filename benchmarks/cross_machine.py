"""Every committed reference receipt (tests/receipts/<isa>/<framework>/) reproduced on this machine with
--match, as a user would, beside one plain training run of the same config (alternating, in one process
tree: this VM drifts 10-30%). Per receipt: the direction (A's machine kind -> this one), the verdict, the
first differing update and its tensors, the top cause, whether --match restored bit-identity, the first
differing operation, and reproduce's wall time against one run.

    .venv/bin/python benchmarks/cross_machine.py --data-dir DATA [--rounds 3] [--out benchmarks/cpu/cross-machine.json]

With --a-on-emulated-cpu EPYC-Milan-v1, A is not a committed receipt but a run of the reference config
trained here on QEMU's model of the AVX2 machine's CPU (reprocube.runtime.cpu_emulation): the AVX2 -> AVX-512 row
as emulated, until an AVX2 machine commits its receipts.

DATA holds fashion_mnist (`reprocube download dataset=fashion_mnist data_dir=DATA ...`)."""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from reprocube.runtime.cpu_emulation import EMULATOR, emulated_command

REPO = Path(__file__).resolve().parents[1]
RECEIPTS = REPO / "tests" / "receipts"
REPROCUBE = [sys.executable, "-m", "reprocube"]
# scripts/make-reference-receipts.sh's config (A's run where A is trained here on an emulated CPU)
REFERENCE_CONFIG = (
    "dataset=fashion_mnist",
    "data.train_limit=2048",
    "data.test_limit=512",
    "epochs=2",
    "seed=3",
    "log.progress=false",
)


def this_isa() -> str:
    flags = Path("/proc/cpuinfo").read_text().split()
    return "avx512" if "avx512f" in flags else "avx2"


def timed(command: list[str], expect=(0, 6, 7)) -> tuple[float, int]:
    started = time.perf_counter()
    proc = subprocess.run(command, capture_output=True, text=True)
    if proc.returncode not in expect:
        sys.exit(f"{' '.join(command)} exited {proc.returncode}:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return time.perf_counter() - started, proc.returncode


def answer(result: dict) -> dict:
    first = result["first_divergence"] or {}
    likely = [c for c in result["causes"] if c["kind"] != "not-numeric"]
    match = result["match"] or {}
    return {
        "verdict": result["verdict"],
        "first_step": first.get("step"),
        "first_update": first.get("first_weight_step"),
        "tensors": first.get("weight_tensors") or first.get("initial_tensors") or first.get("tensors"),
        "top_cause": likely[0]["key"] if likely else None,
        "match": match.get("summary"),
        "match_bit_identical": match.get("bit_identical"),
        "first_operation": (result.get("first_operation") or {}).get("text"),
        "claims": result["claims"]["totals"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path)
    parser.add_argument(
        "--a-on-emulated-cpu",
        metavar="MODEL",
        help="instead of the committed receipts: A trained here on QEMU's CPU model (unsigned, not committed)",
    )
    args = parser.parse_args()
    here = this_isa()
    rows = []
    with tempfile.TemporaryDirectory(prefix="reprocube-cross-machine-") as scratch:
        scratch = Path(scratch)
        if args.a_on_emulated_cpu:
            receipts = [
                (emulated_receipt(framework, args.a_on_emulated_cpu, args.data_dir, scratch), None)
                for framework in ("pytorch", "tensorflow", "jax")
            ]
            kind = f"avx2 emulated by {EMULATOR} -cpu {args.a_on_emulated_cpu}"
        else:
            receipts = [(r, r.parent.parent / "signing-key.pub") for r in sorted(RECEIPTS.glob("*/*/receipt.json"))]
            kind = None
        for receipt, public_key in receipts:
            row = measure(receipt, public_key, kind or receipt.parent.parent.name, here, args, scratch)
            rows.append(row)
            print(
                f"{row['direction']} {row['framework']}: {row['verdict']}, first step {row['first_step']}, "
                f"top cause {row['top_cause']}, --match bit-identical {row['match_bit_identical']}, reproduce "
                f"{statistics.median(row['reproduce_s']):.1f} s = {row['ratio']:.2f}x one run "
                f"({statistics.median(row['run_s']):.1f} s)",
                flush=True,
            )
    report = {
        "machine": {"isa": here, "cpu": _cpu_model(), "python": platform.python_version()},
        "rounds": args.rounds,
        "rows": rows,
    }
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1) + "\n")
    return 0


def emulated_receipt(framework: str, model: str, data_dir: str, scratch: Path) -> Path:
    """A's run, trained here on QEMU's CPU model with the reference receipts' config
    (scripts/make-reference-receipts.sh); its receipt.json."""
    command = emulated_command([*REPROCUBE, "train", f"framework={framework}", *REFERENCE_CONFIG], model)
    runs = scratch / "emulated-a"
    seconds, _ = timed([*command, f"data_dir={data_dir}", f"output_dir={runs}", f"run_name={framework}"], expect=(0,))
    print(f"A ({framework}) trained on {model} in {seconds:.0f} s", flush=True)
    return runs / framework / "receipt.json"


def measure(receipt: Path, public_key: Path | None, a_kind: str, here: str, args, scratch: Path) -> dict:
    """`rounds` alternating rounds of one plain run of A's config and `reproduce --match` of A's receipt."""
    config = json.loads(receipt.read_text())["config"]
    framework = config["framework"]["name"]
    train = [
        *REPROCUBE,
        "train",
        f"framework={framework}",
        "dataset=fashion_mnist",
        f"data_dir={args.data_dir}",
        f"data.train_limit={config['data']['train_limit']}",
        f"data.test_limit={config['data']['test_limit']}",
        f"epochs={config['epochs']}",
        f"seed={config['seed']}",
        "log.progress=false",
    ]
    label = a_kind.split()[0]
    run_s, reproduce_s, result = [], [], None
    for i in range(args.rounds):  # alternating: one run, then reproduce
        seconds, _ = timed([*train, f"output_dir={scratch / f'run-{label}-{framework}-{i}'}"])
        run_s.append(seconds)
        out = scratch / f"reproduce-{label}-{framework}-{i}"
        key = ["--public-key", str(public_key)] if public_key else []
        command = [
            *REPROCUBE,
            "reproduce",
            str(receipt),
            "--match",
            *key,
            "--out",
            str(out),
            f"data_dir={args.data_dir}",
        ]
        seconds, status = timed(command)
        reproduce_s.append(seconds)
        result = json.loads((out / "reproduce.json").read_text())
    shown = receipt.relative_to(REPO) if receipt.is_relative_to(REPO) else f"{receipt.parent.name} (A trained here)"
    return {
        "receipt": str(shown),
        "direction": f"{a_kind} -> {here}",
        "framework": framework,
        "exit": status,
        **answer(result),
        "run_s": run_s,
        "reproduce_s": reproduce_s,
        "ratio": statistics.median(reproduce_s) / statistics.median(run_s),
    }


def _cpu_model() -> str | None:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return None


if __name__ == "__main__":
    raise SystemExit(main())
