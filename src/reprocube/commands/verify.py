"""`reprocube verify`: prove that a configuration resumes bit-exactly. For each framework: train the
uninterrupted reference (or reuse `run=PATH`), a restart with the same seed, a negative control with
another seed, then resume from every epoch checkpoint (and, with verify.mid_epoch=true, from a real
SIGTERM mid-epoch), each in a fresh process, and compare every resumed run with the reference."""

from __future__ import annotations

import time
from pathlib import Path

from reprocube.checkpoint import read_checkpoint, scan_checkpoints
from reprocube.commands.children import child_args, last_error_line, reprocube_command, run_child
from reprocube.commands.compare import compare_runs, load_run, summary_line, write_reports
from reprocube.commands.invocation import Invocation
from reprocube.config import config_differences, to_plain
from reprocube.errors import EXIT_DIFFERENT, EXIT_OK, EXIT_PREEMPTED, ConfigError

PLACE_KEYS = ("framework=", "run_name=", "output_dir=", "resume=", "run=", "seed=", "preempt_at_step=")


def _print_now(line: str) -> None:
    print(line, flush=True)  # progress must reach a batch job's log as it happens


def run(invocation: Invocation) -> int:
    passed = verify(invocation.frameworks, invocation.cfg, invocation.overrides, invocation.config_files)
    return EXIT_OK if passed else EXIT_DIFFERENT


def verify(frameworks: list[str], cfg, overrides: list[str], config_files: list[str], out=_print_now) -> bool:
    """Returns True only if every comparison of every framework passes."""
    if cfg.run:
        if len(frameworks) > 1:
            raise ConfigError("run=PATH is one reference run: name its framework (framework=...), not framework=all")
        _check_reference_config(Path(cfg.run), to_plain(cfg))
    user = child_args(overrides, config_files, PLACE_KEYS)
    rows, all_passed = [], True
    for framework in frameworks:
        result = _verify_framework(framework, cfg, user, out)
        all_passed &= result["passed"]
        rows += [(framework, check["check"], check["summary"], check["passed"]) for check in result["checks"]]
    out("")
    out(_table(rows))
    out(f"verdict: {'all bit-identical' if all_passed else 'NOT reproducible (see above)'}")
    warning = known_not_to_resume(cfg)
    if warning:
        out(f"note: {warning}")
    return all_passed


def _check_reference_config(reference: Path, config: dict) -> None:
    """A reused reference must have been trained under the config verify trains the others with: else
    every check would fail for a reason no check names."""
    found, _ = scan_checkpoints(reference / "checkpoints")
    if not found:
        raise ConfigError(f"run={reference} holds no readable checkpoint (not a reprocube run?)")
    differences = config_differences(read_checkpoint(found[-1]).content.config, config)
    if differences:
        raise ConfigError(
            f"run={reference} was trained with a different config ({'; '.join(differences)}); "
            "give verify the same overrides, or drop run= to train a reference"
        )


def _verify_framework(framework: str, cfg, user: list[str], out) -> dict:
    started = time.perf_counter()
    base = Path(cfg.output_dir) / f"verify-{framework}"
    if base.exists() and any(p.name != "logs" for p in base.iterdir()):
        raise ConfigError(f"{base} holds an earlier verify's runs; remove it or choose another output_dir=")
    logs = base / "logs"
    logs.mkdir(parents=True, exist_ok=True)

    def train(name: str, *extra: str, expect: tuple[int, ...] = (0,)) -> Path:
        command = reprocube_command(
            "train", *user, f"framework={framework}", f"output_dir={base}", f"run_name={name}", *extra
        )
        out(f"[{framework}] {name}: reprocube train {' '.join(extra) or '(reference config)'}")
        log = logs / f"{name}.log"
        status = run_child(command, log)
        if status not in expect:
            raise _ChildFailed(f"{name} exited {status}: {last_error_line(log)} (log: {log})")
        return base / name

    checks = []
    reference = None

    def check(name: str, passed: bool, summary: str, detail: dict | None = None) -> None:
        checks.append({"check": name, "passed": passed, "summary": summary, "detail": detail})

    try:
        reference = Path(cfg.run) if cfg.run else train("reference", f"seed={cfg.seed}")
        ref = load_run(reference)
        epochs = [p for p in ref["checkpoints"] if p.startswith("epoch-")]
        final = ref["checkpoints"][epochs[-1]].manifest if epochs else {}
        if final.get("epoch") != cfg.epochs:
            raise _ChildFailed(f"reference {reference} is not a completed {cfg.epochs}-epoch run")
        compared = lambda run: compare_runs(ref, load_run(run), cfg.verify.tolerance)  # noqa: E731

        restart = compared(train("restart", f"seed={cfg.seed}"))
        check("restart (same seed, fresh process)", restart["passed"], summary_line(restart), restart)
        other = compared(train("other-seed", f"seed={(cfg.seed + 1) % 2**32}"))
        differs = not other["identical"]
        check(
            "negative control (another seed must differ)",
            differs,
            "differs, as it must" if differs else "IDENTICAL: the verdict is meaningless",
            other,
        )
        for k in range(1, cfg.epochs):
            source = reference / "checkpoints" / f"epoch-{k:04d}"
            if not source.is_dir():
                continue  # checkpoint.every_epochs > 1
            resumed = compared(train(f"resume-epoch-{k}", f"seed={cfg.seed}", f"resume={source}"))
            check(f"resume from epoch {k}", resumed["passed"], summary_line(resumed), resumed)
        if cfg.verify.mid_epoch:
            steps = final["steps_per_epoch"]
            stop_at = cfg.verify.mid_epoch_step or (steps + steps // 2 if cfg.epochs > 1 else max(steps // 2, 1))
            run = train("sigterm", f"seed={cfg.seed}", f"preempt_at_step={stop_at}", expect=(EXIT_PREEMPTED,))
            train("sigterm", f"seed={cfg.seed}", "resume=latest")
            sigterm = load_run(run)
            stopped = [name for name in sigterm["checkpoints"] if name.startswith("step-")]
            resumed = compare_runs(ref, sigterm, cfg.verify.tolerance)
            check(
                f"SIGTERM at step {stop_at}, resume=latest",
                resumed["passed"] and bool(stopped),
                summary_line(resumed),
                resumed,
            )
    except _ChildFailed as exc:
        check("run", False, f"failed: {exc}")
    result = {
        "framework": framework,
        "passed": all(c["passed"] for c in checks),
        "tolerance": cfg.verify.tolerance,
        "known_not_to_resume": known_not_to_resume(cfg),
        "wall_s": round(time.perf_counter() - started, 1),
        "checks": checks,
    }
    # Beside the reference it trained; never into a run given with run=PATH (someone else's published run).
    trained_here = reference is not None and not cfg.run and (reference / "checkpoints").is_dir()
    report_dir = reference if trained_here else base
    write_reports(result, report_dir, "verify", _markdown(result))
    out(
        f"[{framework}] {'passed' if result['passed'] else 'FAILED'} in {result['wall_s']} s: {report_dir / 'verify.md'}"
    )
    return result


class _ChildFailed(Exception):
    pass


def _table(rows) -> str:
    widths = [max(len(str(r[i])) for r in rows + [("framework", "check", "result", "")]) for i in range(3)]
    line = lambda r: "  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True))  # noqa: E731
    return "\n".join(
        [line(("framework", "check", "result")), line(["-" * w for w in widths])]
        + [line(r[:3]) + ("" if r[3] else "   <-- FAIL") for r in rows]
    )


def known_not_to_resume(cfg) -> str | None:
    """A setting that reprocube keeps as a negative control: verify is expected to fail on it."""
    if cfg.data.pipeline == "loader" and cfg.data.augment and cfg.data.augment_rng == "stateful":
        return (
            "data.augment_rng=stateful is known not to resume exactly: the augmentation draws from each loader "
            "worker's own generator, seeded when the worker starts and saved in no checkpoint (README: "
            "'Random augmentation that resumes exactly'); use data.augment_rng=stateless"
        )
    return None


def _markdown(result: dict) -> str:
    lines = [
        f"# reprocube verify: {result['framework']}",
        "",
        f"Verdict: **{'passed: bit-identical' if result['passed'] else 'FAILED'}**",
    ]
    if result["tolerance"]:
        lines.append(f"(explicit tolerance: max abs difference <= {result['tolerance']})")
    if result.get("known_not_to_resume"):
        lines += ["", f"Note: {result['known_not_to_resume']}"]
    lines += ["", f"Wall-clock: {result['wall_s']} s", "", "| check | passed | result |", "|---|---|---|"]
    lines += [f"| {c['check']} | {'yes' if c['passed'] else '**no**'} | {c['summary']} |" for c in result["checks"]]
    return "\n".join(lines) + "\n"
