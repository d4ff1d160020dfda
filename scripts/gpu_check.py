"""The work behind scripts/gpu-check.sh: reprocube's claims checked on one host, each in fresh processes
through reprocube's own commands, for every framework installed here (PyTorch, JAX, TensorFlow):

  restart      two trainings from scratch: every epoch checkpoint bit-identical (reprocube compare)
  resume-epoch a training stopped after epoch 1 (stop_after_epoch) and resumed: identical to the first
  resume-sigterm  a training stopped by SIGTERM mid-epoch (preempt_at_step) and resumed: identical
  verify       `reprocube verify` (linear: one fresh-process link per epoch, a SIGTERM link, a control)
  fingerprint  the weight fingerprint the device computed after each checkpoint's step equals the NumPy
               reference's of that checkpoint's weights (reprocube.formats.trace.fingerprint)
  reproduce    `reprocube reproduce` of the first run's receipt on this host: bit-identical
  nondeterministic  deterministic=false trained twice: identical or not, recorded (a finding, not a check)
  replay-nondeterministic  the receipt reproduced with deterministic=false: the verdict, first differing
               step and the operation the first-operation replay names (a finding, not a check)
  bench        `reprocube bench` at batch 32 and 64, deterministic on and off (seconds per epoch)

It records the device, driver, CUDA, cuDNN, cuBLAS and library versions (from the runs' env.json and
nvidia-smi), writes gpu-check.json and gpu-check.md into --out, and a receipt trained on this host's
CPU (device=cpu) under --out/cpu-receipt/, so that the host is "another machine" for `reprocube
reproduce`. Exit 0: every bit-exactness check passed; 1: one failed; 2: bad arguments.

Extra KEY=VALUE arguments are passed to every reprocube command (e.g. data_dir=... or a small dataset)."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

FRAMEWORK_MODULES = {"pytorch": "torch", "jax": "jax", "tensorflow": "tensorflow"}
EXIT_PREEMPTED = 75
CHECKS = ("restart", "resume-epoch", "resume-sigterm", "verify", "fingerprint", "reproduce")
BATCH_SIZES = (32, 64)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/gpu-check.sh", description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--out", type=Path, default=Path("gpu-check"), help="a new or empty directory")
    parser.add_argument("--frameworks", default=None, help="comma-separated (default: every one installed)")
    parser.add_argument("--epochs", type=int, default=2, help="epochs per training (default 2)")
    parser.add_argument(
        "--sigterm-step", type=int, default=None, help="global step of the SIGTERM (default: mid-epoch 2)"
    )
    parser.add_argument("--bench-repeats", type=int, default=1, help="fresh processes per bench figure (default 1)")
    parser.add_argument("--no-bench", action="store_true", help="skip reprocube bench")
    parser.add_argument(
        "--bench-only", action="store_true", help="only reprocube bench (timings on an otherwise idle host)"
    )
    parser.add_argument(
        "--checks",
        default=",".join(CHECKS),
        help=f"comma-separated subset of {','.join(CHECKS)} (default: all; a subset skips the findings)",
    )
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="passed to every reprocube command")
    args = parser.parse_args(argv)
    if args.no_bench and args.bench_only:
        parser.error("--no-bench and --bench-only leave nothing to do")
    args.checks = args.checks.split(",")
    if unknown := [c for c in args.checks if c not in CHECKS]:
        parser.error(f"unknown check {unknown[0]!r} (choose from {', '.join(CHECKS)})")
    if args.epochs < 2:
        parser.error("--epochs must be at least 2 (a resume needs an epoch to resume into)")
    frameworks = (
        args.frameworks.split(",")
        if args.frameworks
        else [name for name, module in FRAMEWORK_MODULES.items() if importlib.util.find_spec(module) is not None]
    )
    unknown = [f for f in frameworks if f not in FRAMEWORK_MODULES]
    if unknown or not frameworks:
        parser.error(
            f"--frameworks: {', '.join(unknown) or 'none installed'} (choose from {', '.join(FRAMEWORK_MODULES)})"
        )
    out = args.out.resolve()
    if out.is_symlink() or (out.exists() and (not out.is_dir() or any(out.iterdir()))):
        parser.error(f"--out {args.out} must be a new or empty directory")
    out.mkdir(parents=True, exist_ok=True)
    check = Check(out, args.overrides)
    started = time.perf_counter()
    results = {
        "device_requested": args.device,
        "epochs": args.epochs,
        "overrides": args.overrides,
        "host": host_info(),
        "frameworks": {},
    }
    for framework in frameworks:
        results["frameworks"][framework] = check_framework(check, framework, args)
    if args.bench_only:
        results["cpu_receipt"] = {"ok": True, "summary": "not made (--bench-only)"}
    else:
        results["cpu_receipt"] = cpu_receipt(check, frameworks[0])
    results["passed"] = all(r["passed"] for r in results["frameworks"].values()) and results["cpu_receipt"]["ok"]
    results["wall_s"] = round(time.perf_counter() - started, 1)
    (out / "gpu-check.json").write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    (out / "gpu-check.md").write_text(markdown(results))
    print(f"gpu-check: {'PASSED' if results['passed'] else 'FAILED'}: {out / 'gpu-check.md'}")
    return 0 if results["passed"] else 1


class Check:
    """Runs reprocube commands under --out, each logged to --out/logs/NAME.log."""

    def __init__(self, out: Path, overrides: list[str]):
        self.out, self.overrides = out, overrides
        (out / "logs").mkdir(exist_ok=True)

    def reprocube(self, name: str, *args: str) -> int:
        log = self.out / "logs" / f"{name}.log"
        command = [sys.executable, "-m", "reprocube", *args]
        print(f"  {name}: reprocube {shlex.join(args[:2])} ...", flush=True)
        with open(log, "a") as stream:
            stream.write(f"$ {shlex.join(command)}\n")
            stream.flush()
            return subprocess.run(command, stdout=stream, stderr=subprocess.STDOUT, cwd=self.out).returncode

    def last_line(self, name: str) -> str:
        log = self.out / "logs" / f"{name}.log"
        lines = log.read_text(errors="replace").splitlines() if log.is_file() else ["not run"]
        own = [line for line in lines if line.startswith(("reprocube:", "verdict", "FAILED"))]
        return (own or lines or ["no output"])[-1][:300]


def check_framework(check: Check, framework: str, args) -> dict:
    print(f"[{framework}] on {args.device}", flush=True)
    runs = check.out / framework / "runs"
    base = [f"framework={framework}", f"device={args.device}", f"epochs={args.epochs}", f"output_dir={runs}",
            "log.progress=false", *check.overrides]  # fmt: skip
    if args.bench_only:
        return {"passed": True, "checks": [], "bench": bench(check, framework, base, args), "framework_env": {},
                "without_determinism": None, "replay_without_determinism": None, "final_weights_digest": None,
                "process_wall_s": {}}  # fmt: skip
    checks, timings, failures = [], {}, []

    def train(name: str, *extra: str, expect: int = 0) -> bool:
        started = time.perf_counter()
        status = check.reprocube(f"{framework}-{name}", "train", *base, f"run_name={name}", *extra)
        timings[name] = round(time.perf_counter() - started, 2)
        if status != expect:
            failures.append(f"training {name} exited {status}: {check.last_line(f'{framework}-{name}')}")
        return status == expect

    def failed() -> dict:
        # The reason, not only the fact: a GPU host's first run failed on data that was still .gz.
        return {"identical": False, "summary": failures[-1] if failures else "training failed"}

    def compare(name: str, a: str, b: str) -> dict:
        out = check.out / framework / f"compare-{a}-vs-{b}"
        status = check.reprocube(f"{framework}-{name}", "compare", str(runs / a), str(runs / b), "--out", str(out))
        verdict = json.loads((out / "compare.json").read_text()) if (out / "compare.json").is_file() else {}
        return {"identical": status == 0 and verdict.get("identical") is True,
                "summary": check.last_line(f"{framework}-{name}") if status not in (0, 6) else
                f"{len(verdict.get('compared_checkpoints', []))} checkpoints compared, identical: {verdict.get('identical')}"}  # fmt: skip

    def record(name: str, ok: bool, summary: str) -> None:
        checks.append({"check": name, "passed": bool(ok), "summary": summary})
        print(f"  {name}: {'ok' if ok else 'FAILED'}: {summary}", flush=True)

    wanted = set(args.checks)
    first_ok = train("first")
    if "restart" in wanted:
        restart = compare("restart", "first", "second") if first_ok and train("second") else failed()
        record("restart", restart["identical"], restart["summary"])
    if "resume-epoch" in wanted:
        resumed = train("resume-epoch", "stop_after_epoch=1") and train("resume-epoch", "resume=latest")
        outcome = compare("resume-epoch", "first", "resume-epoch") if resumed else failed()
        record("resume-epoch", outcome["identical"], outcome["summary"])
    steps = _steps_per_epoch(runs / "first")
    at = args.sigterm_step or (steps + max(steps // 2, 1) if steps else None)
    if "resume-sigterm" not in wanted:
        pass
    elif at is None:
        record("resume-sigterm", False, "the first run recorded no epoch (no steps per epoch)")
    else:
        stopped = train("resume-sigterm", f"preempt_at_step={at}", expect=EXIT_PREEMPTED)
        resumed = stopped and train("resume-sigterm", "resume=latest")
        outcome = compare("resume-sigterm", "first", "resume-sigterm") if resumed else failed()
        record("resume-sigterm", outcome["identical"], f"SIGTERM after global step {at}: {outcome['summary']}")
    if "verify" in wanted:
        started = time.perf_counter()
        status = check.reprocube(f"{framework}-verify", "verify", *[o for o in base if not o.startswith("output_dir=")],
                                 f"output_dir={check.out / framework / 'verify'}")  # fmt: skip
        timings["verify"] = round(time.perf_counter() - started, 2)
        record("verify", status == 0, check.last_line(f"{framework}-verify"))
    if first_ok and "fingerprint" in wanted:
        ok, summary = fingerprints_match_reference(runs / "first")
        record("fingerprint", ok, summary)
    if first_ok and "reproduce" in wanted:
        started = time.perf_counter()
        result = reproduce(check, framework, runs / "first", "reproduce")
        timings["reproduce"] = round(time.perf_counter() - started, 2)
        record("reproduce", result.get("verdict") == "bit-identical", _reproduce_summary(result, check, framework))
    # Findings, not checks (only with every check): whether this device gives other bits without the
    # determinism flags, and what reproduce says of a B trained without them.
    nondeterministic, replay = {}, {}
    findings = wanted == set(CHECKS)
    if (
        findings
        and train("nondeterministic-1", "deterministic=false")
        and train("nondeterministic-2", "deterministic=false")
    ):
        nondeterministic = compare("nondeterministic", "nondeterministic-1", "nondeterministic-2")
    if findings and first_ok:
        replay = reproduce(check, framework, runs / "first", "replay-nondeterministic", "deterministic=false",
                           "--allow-config-change")  # fmt: skip
    env = _read_json(runs / "first" / "env.json")
    return {
        "passed": all(c["passed"] for c in checks),
        "checks": checks,
        # A finding, not a check: whether this device gives other bits without the determinism flags.
        "without_determinism": {
            "identical": nondeterministic.get("identical"),
            "digests": [_final_digest(runs / f"nondeterministic-{i}") for i in (1, 2)],
        },
        "replay_without_determinism": {
            "summary": _reproduce_summary(replay, check, framework, "replay-nondeterministic"),
            "verdict": replay.get("verdict"),
            "first_divergence": replay.get("first_divergence"),
            "first_operation": replay.get("first_operation"),
        },
        "final_weights_digest": _final_digest(runs / "first"),
        "framework_env": env.get("framework", {}),
        "packages": env.get("packages", {}),
        "process_wall_s": timings,
        "bench": None if args.no_bench else bench(check, framework, base, args),
    }


def fingerprints_match_reference(run: Path) -> tuple[bool, str]:
    """Each checkpoint's weights through the NumPy reference against the model fingerprint the trainer
    computed on its device after that checkpoint's step (the receipt's trace)."""
    from reprocube.errors import ReprocubeError
    from reprocube.formats.trace import fingerprint, model_fingerprint
    from reprocube.training.checkpoint import list_checkpoints, read_checkpoint
    from reprocube.training.receipt import read_receipt

    try:
        trace = read_receipt(run).trace
        if trace.fingerprint_first_step is None:
            return False, "the receipt's trace holds no fingerprints"
        compared, differ = 0, []
        for path in list_checkpoints(run / "checkpoints"):
            checkpoint = read_checkpoint(path)
            step = checkpoint.manifest.global_step
            index = step - trace.fingerprint_first_step - 1
            if not 0 <= index < len(trace.fingerprints):
                continue
            reference = int(model_fingerprint(fingerprint(checkpoint.content.weights)[None])[0])
            compared += 1
            if reference != int(trace.fingerprints[index]):
                differ.append(f"{path.name} (device {int(trace.fingerprints[index]):#010x}, NumPy {reference:#010x})")
    except ReprocubeError as error:
        return False, f"not read: {error}"
    if not compared:
        return False, "no checkpoint within the fingerprinted steps"
    if differ:
        return False, f"differs from the NumPy reference at {', '.join(differ)}"
    return True, f"the device's fingerprint equals the NumPy reference's at {compared} checkpoints"


def reproduce(check: Check, framework: str, run: Path, name: str, *extra: str) -> dict:
    """`reprocube reproduce` of a run's receipt on this host (place keys only: the receipt has the rest)."""
    out = check.out / framework / name
    place = [o for o in check.overrides if o.startswith("data_dir=")]
    check.reprocube(f"{framework}-{name}", "reproduce", str(run), "--out", str(out), *place, *extra)
    return _read_json(out / "reproduce.json")


def _reproduce_summary(result: dict, check: Check, framework: str, name: str = "reproduce") -> str:
    if not result:
        return f"no reproduce.json: {check.last_line(f'{framework}-{name}')}"
    first = result.get("first_divergence") or {}
    operation = result.get("first_operation") or {}
    parts = [f"verdict {result.get('verdict')}"]
    if first:
        parts.append(f"first differing step {first.get('step')} (by {first.get('by')}, tensors {first.get('tensors')})")
    if operation:
        parts.append(f"first operation ({operation.get('status')}): {str(operation.get('text'))[:200]}")
    return "; ".join(parts)


def bench(check: Check, framework: str, base: list[str], args) -> dict:
    """Seconds per epoch at each batch size, deterministic on and off (reprocube bench's own figures)."""
    results = {}
    for batch in BATCH_SIZES:
        out = check.out / framework / f"bench-{batch}"
        keep = [o for o in base if not o.startswith(("output_dir=", "epochs=", "log."))]
        status = check.reprocube(f"{framework}-bench-{batch}", "bench", *keep, f"batch_size={batch}",
                                 f"bench.repeats={args.bench_repeats}", "bench.verify_epochs=[]", f"bench.out={out}")  # fmt: skip
        summary = _read_json(out / "bench.json").get("frameworks", {}).get(framework, {})
        results[str(batch)] = {"status": status, "summary": summary.get("summary", summary)}
    return results


def cpu_receipt(check: Check, framework: str) -> dict:
    """A small run on this host's CPU: its receipt, for `reprocube reproduce` on another machine."""
    runs = check.out / "cpu-receipt" / "runs"
    status = check.reprocube("cpu-receipt", "train", f"framework={framework}", "device=cpu", "epochs=2",
                             f"output_dir={runs}", "run_name=cpu", "log.progress=false", *check.overrides)  # fmt: skip
    receipt = runs / "cpu" / "receipt.json"
    if status != 0 or not receipt.is_file():
        return {"ok": False, "summary": check.last_line("cpu-receipt")}
    shutil.copyfile(receipt, check.out / "cpu-receipt" / "receipt.json")
    env = _read_json(runs / "cpu" / "env.json")
    return {"ok": True, "framework": framework, "receipt": "cpu-receipt/receipt.json",
            "cpu": env.get("cpu", {}), "final_weights_digest": _final_digest(runs / "cpu")}  # fmt: skip


def host_info() -> dict:
    """The GPU as nvidia-smi sees it (absent on a CPU host), and the Python running the checks."""
    info = {"python": sys.version.split()[0], "nvidia_smi": None}
    if shutil.which("nvidia-smi"):
        query = "name,driver_version,memory.total,compute_cap"
        proc = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"], capture_output=True,
                              text=True, timeout=30)  # fmt: skip
        info["nvidia_smi"] = proc.stdout.strip() if proc.returncode == 0 else f"exit {proc.returncode}"
    return info


def _steps_per_epoch(run: Path) -> int | None:
    records = [json.loads(line) for line in _lines(run / "metrics.jsonl")]
    epochs = [r for r in records if r.get("kind") == "epoch" and r.get("epoch") == 1]
    return epochs[0]["global_step"] if epochs else None


def _final_digest(run: Path) -> str | None:
    records = [json.loads(line) for line in _lines(run / "metrics.jsonl")]
    epochs = [r for r in records if r.get("kind") == "epoch"]
    return epochs[-1]["weights_digest"] if epochs else None


def _lines(path: Path) -> list[str]:
    return [line for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []


def _read_json(path: Path) -> dict:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def markdown(results: dict) -> str:
    lines = [
        "# reprocube GPU check",
        "",
        f"Verdict: **{'passed' if results['passed'] else 'FAILED'}** on device `{results['device_requested']}`, "
        f"{results['epochs']} epochs per training, {results['wall_s']} s in all.",
        "",
        f"- host: nvidia-smi `{results['host']['nvidia_smi']}`, Python {results['host']['python']}",
        "",
    ]
    for framework, result in results["frameworks"].items():
        env = result["framework_env"]
        versions = ", ".join(f"{k} {env[k]}" for k in ("torch", "jax", "jaxlib", "tensorflow", "cuda", "cudnn",
                                                      "cublas", "driver", "gpu", "device") if env.get(k))  # fmt: skip
        lines += [f"## {framework}", "", f"{versions or 'no environment recorded'}", "",
                  "| check | passed | result |", "|---|---|---|"]  # fmt: skip
        lines += [f"| {c['check']} | {'yes' if c['passed'] else '**no**'} | {c['summary']} |" for c in result["checks"]]
        without = result["without_determinism"]
        if without is not None:
            lines += ["", f"- deterministic=false trained twice: identical = {without['identical']} "
                          f"(final digests {', '.join(str(d)[:12] for d in without['digests'])})",
                      f"- reproduced with deterministic=false: {result['replay_without_determinism']['summary']}",
                      f"- final weights_digest: `{result['final_weights_digest']}`",
                      f"- process seconds: {json.dumps(result['process_wall_s'])}"]  # fmt: skip
        for batch, figures in (result["bench"] or {}).items():
            lines.append(f"- bench at batch {batch}: exit {figures['status']}, {json.dumps(figures['summary'])[:600]}")
        lines.append("")
    receipt = results["cpu_receipt"]
    lines += ["## A receipt made on this host's CPU", "",
              f"`{receipt.get('receipt')}` ({receipt.get('framework')}; CPU {receipt.get('cpu', {}).get('model')}): "
              "reproduce it on another machine with `reprocube reproduce RECEIPT --match data_dir=...`"
              if receipt["ok"] else f"failed: {receipt['summary']}", ""]  # fmt: skip
    return "\n".join(lines)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
