"""study.json and study.md (`reprocube study`), and each member's record in STUDY/results/: the schemas,
the writers and the strict readers (`reprocube report` and `reproduce --study` read study.json back)."""

from __future__ import annotations

from pathlib import Path

from reprocube.errors import CheckpointError, ReprocubeError
from reprocube.results.markdown_text import md_code, md_text
from reprocube.results.schema import ResultFile
from reprocube.untrusted import Fields, read_json

GROUPS = ("same_seed", "different_seeds")
STUDY_RESULT = ResultFile(
    "study.json",
    version=1,
    keys=(
        "study_dir",
        "runs_per_group",
        "seed",
        "groups",  # GROUPS -> {runs, distinct_weights_digests, test_accuracy and test_loss: mean, std, min, max}
        "runs",  # the members' records
        "failures",
        "nondeterminism_std_ratio",  # same-seed std / different-seed std (Morin & Willetts)
        "nondeterminism_variance_ratio",
    ),
    optional_keys=("launcher_error", "request"),  # request: what the study was asked (study-request.json)
)
# One member's record, STUDY/results/<run name>.json, written in the member's job.
MEMBER_KEYS = ("member", "group", "seed", "run", "log", "exit_code", "slurm_job_id", "status")
MEMBER_OK_KEYS = ("epoch", "test_accuracy", "test_loss", "train_loss", "weights_digest")
MEMBER_FAILED_KEYS = ("error",)


def write_study(result: dict, study_dir: Path) -> Path:
    return STUDY_RESULT.write(study_dir, result, study_markdown(result))


def read_member(path: Path) -> dict:
    """A member's result record (written by reprocube.orchestration.study_members in a job), with the fields
    collect uses checked."""
    if not path.exists():
        raise FileNotFoundError(path)
    record = Fields(read_json(path, ReprocubeError), str(path), ReprocubeError)
    record.integer("member")
    record.integer("seed", 0, 2**32 - 1)
    if record.text("group") not in GROUPS:
        raise ReprocubeError(f"{path}: group must be one of {', '.join(GROUPS)}")
    ok = record.text("status") == "ok"
    expected = {*MEMBER_KEYS, *(MEMBER_OK_KEYS if ok else MEMBER_FAILED_KEYS)}
    if set(record.value) != expected:
        unknown = sorted(set(record.value) - expected) or sorted(expected - set(record.value))
        raise ReprocubeError(f"{path}: keys {unknown[:3]} are not a member record's ({', '.join(sorted(expected))})")
    if not ok:
        record.text("error")
    else:
        record.number("test_accuracy")
        record.number("test_loss")
        record.text("weights_digest")
    return record.value


def read_study(directory: Path) -> dict:
    """A study directory's study.json, every field `reprocube report` shows type-checked."""
    path = Path(directory) / STUDY_RESULT.name
    where = str(path)
    study = STUDY_RESULT.read(path)
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


def summary_lines(result: dict) -> list[str]:
    lines = []
    for group, summary in result["groups"].items():
        acc, loss = summary["test_accuracy"], summary["test_loss"]
        lines.append(
            f"{group}: {summary['runs']} runs, test accuracy mean {_fmt(acc['mean'])} std {_fmt(acc['std'])}, "
            f"test loss mean {_fmt(loss['mean'])} std {_fmt(loss['std'])}, "
            f"{summary['distinct_weights_digests']} distinct weights_digest"
        )
    lines.append(
        f"non-determinism: same-seed std / different-seed std = {_fmt(result['nondeterminism_std_ratio'])} "
        f"(variance ratio {_fmt(result['nondeterminism_variance_ratio'])}; Morin & Willetts: 0.020 / 0.027 = 0.74)"
    )
    for failure in result["failures"]:
        lines.append(
            f"FAILED run {failure['member']} ({failure['group']}, seed {failure['seed']}): "
            f"{failure['error']}; log: {failure.get('log')}"
        )
    if result.get("launcher_error"):
        lines.append(f"launcher: {result['launcher_error']}")
    return lines


def _fmt(value) -> str:
    return "n/a" if value is None else f"{value:.6g}"


def study_markdown(result: dict) -> str:
    rows = [
        "| group | runs | test accuracy mean | std | test loss mean | std | distinct weights_digest |",
        "|---|---|---|---|---|---|---|",
    ]
    for group, s in result["groups"].items():
        rows.append(
            f"| {group} | {s['runs']} | {_fmt(s['test_accuracy']['mean'])} | {_fmt(s['test_accuracy']['std'])} | "
            f"{_fmt(s['test_loss']['mean'])} | {_fmt(s['test_loss']['std'])} | {s['distinct_weights_digests']} |"
        )
    text = [
        "# Variance study",
        "",
        f"Study directory: {md_code(result['study_dir'])}; {result['runs_per_group']} runs per group, "
        f"seed {result['seed']}.",
        "",
        *rows,
        "",
        *[f"- {md_text(line)}" for line in summary_lines(result)[2:]],
        f"- Same-seed std / different-seed std: {_fmt(result['nondeterminism_std_ratio'])} (Morin & Willetts: 0.74).",
        "",
        "![box plot](study.png)",
        "",
    ]
    return "\n".join(text)
