"""The variance study's results: every member's recorded result collected, the groups' statistics (the
same-seed std against the different-seed std), study.json, study.md and the box plot; what `reprocube
report` reads back from a study directory. The driver that produces them is reprocube.commands.study."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path

from reprocube.errors import CheckpointError, ReprocubeError
from reprocube.files import write_file_atomic, write_json_atomic
from reprocube.untrusted import Fields, read_json

GROUPS = ("same_seed", "different_seeds")
STUDY_RESULT = "study.json"


@dataclass(frozen=True)
class Member:
    """One run of the study: member k < N is same-seed run k, member N + k is different-seed run k."""

    index: int
    group: str
    seed: int
    run_name: str


def members(runs: int, seed: int) -> list[Member]:
    same = [Member(k, GROUPS[0], seed, f"same-seed-{k:02d}") for k in range(runs)]
    different = [Member(runs + k, GROUPS[1], (seed + 1 + k) % 2**32, f"different-seed-{k:02d}") for k in range(runs)]
    return same + different


def study_paths(study_dir: Path) -> dict[str, Path]:
    return {name: study_dir / name for name in ("runs", "logs", "results", "hydra", "slurm")}


def collect(study_dir: Path, runs: int, seed: int, launcher: str = "local") -> dict:
    """Every member's recorded result; a member without one is listed as failed, with its logs."""
    paths = study_paths(study_dir)
    records, failures = [], []
    for member in members(runs, seed):
        path = paths["results"] / f"{member.run_name}.json"
        try:
            record = _read_result(path)
        except FileNotFoundError:
            logs = [str(paths["logs"] / f"{member.run_name}.log")] + (
                [_slurm_folder(paths["slurm"], member.index)] if launcher == "slurm" else []
            )
            record = {"member": member.index, "group": member.group, "seed": member.seed, "status": "failed",
                      "error": "no result recorded (the job did not finish)", "log": " and ".join(logs)}  # fmt: skip
        except (OSError, ReprocubeError) as exc:
            record = {
                "member": member.index,
                "group": member.group,
                "seed": member.seed,
                "status": "failed",
                "error": f"unreadable result: {exc}",
            }
        (records if record.get("status") == "ok" else failures).append(record)
    groups = {group: _group_summary([r for r in records if r["group"] == group]) for group in GROUPS}
    same, different = groups[GROUPS[0]], groups[GROUPS[1]]
    result = {
        "study_dir": str(study_dir),
        "runs_per_group": runs,
        "seed": seed,
        "groups": groups,
        "runs": records,
        "failures": failures,
        # Morin & Willetts' figure: the same-seed std as a share of the different-seed std.
        "nondeterminism_std_ratio": _ratio(same["test_accuracy"]["std"], different["test_accuracy"]["std"]),
        "nondeterminism_variance_ratio": _ratio(
            _square(same["test_accuracy"]["std"]), _square(different["test_accuracy"]["std"])
        ),
    }
    return result


def _read_result(path: Path) -> dict:
    """A member's result record (written by the study's driver in a job), with the fields collect uses."""
    if not path.exists():
        raise FileNotFoundError(path)
    record = Fields(read_json(path, ReprocubeError), str(path), ReprocubeError)
    record.integer("member")
    record.integer("seed", 0, 2**32 - 1)
    record.text("group")
    if record.text("status") != "ok":
        record.text("error")
    else:
        record.number("test_accuracy")
        record.number("test_loss")
        record.text("weights_digest")
        if record.text("group") not in GROUPS:
            raise ReprocubeError(f"{path}: group must be one of {', '.join(GROUPS)}")
    return record.value


def _slurm_folder(slurm_dir: Path, index: int) -> str:
    """submitit's folder for a member's job (JOBID_INDEX; the newest, if the study ran more than once)."""
    folders = sorted(slurm_dir.glob(f"*_{index}"), key=lambda p: p.stat().st_mtime) if slurm_dir.is_dir() else []
    return str(folders[-1]) if folders else str(slurm_dir)


def _group_summary(records: list[dict]) -> dict:
    summary = {"runs": len(records), "distinct_weights_digests": len({r["weights_digest"] for r in records})}
    for key in ("test_accuracy", "test_loss"):
        values = [float(r[key]) for r in records]
        summary[key] = {
            "mean": statistics.fmean(values) if values else None,
            "std": statistics.stdev(values) if len(values) > 1 else None,  # sample std (n - 1)
            "min": min(values, default=None),
            "max": max(values, default=None),
        }
    return summary


def _ratio(a, b):
    return None if a is None or not b else a / b


def _square(value):
    return None if value is None else value * value


def summary_lines(result: dict) -> list[str]:
    lines = []
    for group, summary in result["groups"].items():
        acc, loss = summary["test_accuracy"], summary["test_loss"]
        lines.append(f"{group}: {summary['runs']} runs, test accuracy mean {_fmt(acc['mean'])} std {_fmt(acc['std'])}, "
                     f"test loss mean {_fmt(loss['mean'])} std {_fmt(loss['std'])}, {summary['distinct_weights_digests']} distinct weights_digest")  # fmt: skip
    lines.append(f"non-determinism: same-seed std / different-seed std = {_fmt(result['nondeterminism_std_ratio'])} "
                 f"(variance ratio {_fmt(result['nondeterminism_variance_ratio'])}; Morin & Willetts: 0.020 / 0.027 = 0.74)")  # fmt: skip
    for failure in result["failures"]:
        lines.append(
            f"FAILED run {failure['member']} ({failure['group']}, seed {failure['seed']}): {failure['error']}; log: {failure.get('log')}"
        )
    if result.get("launcher_error"):
        lines.append(f"launcher: {result['launcher_error']}")
    return lines


def _fmt(value) -> str:
    return "n/a" if value is None else f"{value:.6g}"


def write_study(result: dict, study_dir: Path) -> None:
    write_json_atomic(study_dir / STUDY_RESULT, result, indent=2)
    write_file_atomic(study_dir / "study.png", box_plot(result))
    write_file_atomic(study_dir / "study.md", study_markdown(result).encode())


def read_study(path: Path) -> dict:
    """A study directory's study.json, every field `reprocube report` shows type-checked."""
    where = str(path / STUDY_RESULT)
    study = Fields(read_json(path / STUDY_RESULT, CheckpointError), where, CheckpointError)
    groups = study.mapping("groups")
    for group in GROUPS:
        summary = groups.mapping(group)
        summary.integer("runs")
        summary.integer("distinct_weights_digests")
        for metric in ("test_accuracy", "test_loss"):
            statistics_ = summary.mapping(metric)
            for key in ("mean", "std", "min", "max"):
                if statistics_.value.get(key) is not None:
                    statistics_.number(key)
    if set(groups.value) != set(GROUPS):
        raise CheckpointError(f"{where}: groups must be exactly {', '.join(GROUPS)}")
    for record in study.records("runs"):
        if record.text("group") not in GROUPS:
            raise CheckpointError(f"{record.where}: group must be one of {', '.join(GROUPS)}")
        record.number("test_accuracy")
        record.number("test_loss")
    for failure in study.records("failures"):
        failure.integer("member")
        failure.integer("seed", 0, 2**32 - 1)
        failure.text("group")
        failure.text("error")
    for key in ("nondeterminism_std_ratio", "nondeterminism_variance_ratio"):
        if study.value.get(key) is not None:
            study.number(key)
    study.integer("runs_per_group")
    study.integer("seed", 0, 2**32 - 1)
    study.text("study_dir")
    study.text("launcher_error", optional=True)
    return study.value


def study_markdown(result: dict) -> str:
    rows = [
        "| group | runs | test accuracy mean | std | test loss mean | std | distinct weights_digest |",
        "|---|---|---|---|---|---|---|",
    ]
    for group, s in result["groups"].items():
        rows.append(f"| {group} | {s['runs']} | {_fmt(s['test_accuracy']['mean'])} | {_fmt(s['test_accuracy']['std'])} | "
                    f"{_fmt(s['test_loss']['mean'])} | {_fmt(s['test_loss']['std'])} | {s['distinct_weights_digests']} |")  # fmt: skip
    text = ["# Variance study", "", f"Study directory: `{result['study_dir']}`; {result['runs_per_group']} runs per group, seed {result['seed']}.", "",
            *rows, "", *[f"- {line}" for line in summary_lines(result)[2:]],
            f"- Same-seed std / different-seed std: {_fmt(result['nondeterminism_std_ratio'])} (Morin & Willetts: 0.74).", "",
            "![box plot](study.png)", ""]  # fmt: skip
    return "\n".join(text)


def box_plot(result: dict) -> bytes:
    import io

    from reprocube.plots import plt  # matplotlib: imported only now

    fig, axes = plt.subplots(1, 2, figsize=(9, 4), layout="constrained")
    for ax, key in zip(axes, ("test_accuracy", "test_loss"), strict=True):
        data = [[float(r[key]) for r in result["runs"] if r["group"] == group] for group in GROUPS]
        ax.boxplot(
            [d or [float("nan")] for d in data],
            tick_labels=[f"{g}\n({len(d)} runs)" for g, d in zip(GROUPS, data, strict=True)],
        )
        for position, values in enumerate(data, start=1):
            ax.scatter([position] * len(values), values, s=14, alpha=0.7, zorder=3)
        ax.set_title(key.replace("_", " "))
        ax.grid(alpha=0.3)
    fig.suptitle("final test metrics: same seed vs different seeds")
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    plt.close(fig)
    return buffer.getvalue()
