"""Times the public reference tutorial's three MNIST trainers on this machine, offline, per epoch.

The tutorial is github.com/WolodjaZ/reproduc-ml-tutorial (commit 0fff0e5): mnist_pytorch.py,
mnist_tensorflow.py, mnist_jax.py and workspace/train.yaml (batch 32 train / 64 test, SGD lr 0.01
momentum 0.5, seed 0, 4 DataLoader workers). Its code is never committed here: pass a checkout
(--tutorial DIR) or a git directory (--tutorial-git GITDIR). The files are copied into a temporary
work dir and run with their own timing and logging; this script parses the per-epoch train and test
times they log. Everything that differs from running them as published is listed in the output and
the JSON, one line of reason each:

  * mnist_tensorflow.py: keras' mnist.load_data(path) checks MNIST's sha256 and downloads on a
    mismatch, so the load_data call is replaced by the np.load it does after that check;
    TF_USE_LEGACY_KERAS=1 (Keras 3 has no Metric.reset_states; tf_keras is the Keras 2 it was written for).
  * mnist_jax.py: current orbax refuses a relative checkpoint path; the path is made absolute.
  * mnist_pytorch.py, mnist_jax.py: a stand-in `torchvision` package (benchmarks/reference/standin)
    is put next to them, as torchvision cannot import against CPU torch; it keeps the per-sample
    PIL image -> ToTensor -> Normalize path.
  * all: data is Fashion-MNIST (same format and shapes) in MNIST's place, as MNIST needs the internet;
    Hydra's config path (/mlcube/workspace) and n_epochs are overridden on the command line, and
    WORKSPACE_PATH is set, as their run.sh does. --train-limit / --test-limit shorten the data.
  No device edit is needed: each script falls back to the CPU by itself.
  Optional, listed when used: --torch-threads N sets OMP_NUM_THREADS for mnist_pytorch.py (torch's
  default, one intra-op thread per core, slows down many times over on a loaded 2-core machine).

Every source edit is an exact-string replacement that must match once, or the script stops.
The trainers run with a separate venv (benchmarks/reference/.venv, made by --setup from
benchmarks/reference/requirements.in), never the project's.

Usage: python benchmarks/reference_tutorial.py --tutorial-git GITDIR [--frameworks pytorch,tensorflow,jax]
           [--epochs 2] [--train-limit N] [--out reference-results.json] [--keep]
       python benchmarks/reference_tutorial.py --setup
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import hashlib
import json
import os
import platform
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REFERENCE_DIR = HERE / "reference"
DEFAULT_PYTHON = REFERENCE_DIR / ".venv" / "bin" / "python"
REQUIREMENTS = REFERENCE_DIR / "requirements.in"
STANDIN_TORCHVISION = REFERENCE_DIR / "standin" / "torchvision"
DEFAULT_DATA = Path("/usr/share/datasets/fashion-mnist")
DEFAULT_WHEELS = Path("/opt/wheels")
TUTORIAL_FILES = ["mnist_pytorch.py", "mnist_tensorflow.py", "mnist_jax.py", "workspace/train.yaml"]
FRAMEWORKS = {"pytorch": "mnist_pytorch.py", "tensorflow": "mnist_tensorflow.py", "jax": "mnist_jax.py"}
VERSION_PACKAGES = [
    "torch",
    "tensorflow",
    "tf-keras",
    "keras",
    "jax",
    "jaxlib",
    "flax",
    "optax",
    "orbax-checkpoint",
    "hydra-core",
    "omegaconf",
    "ml-collections",
    "pillow",
    "numpy",
]
MARK = "# [reference_tutorial.py edit]"


class Failure(Exception):
    """A one-line error for the user; the script exits non-zero with it."""


@dataclass
class Change:
    """One difference from running the tutorial as published."""

    applies_to: list[str]  # frameworks
    kind: str  # source (exact replacement in the script), shim, env, cli or data
    file: str
    what: str
    why: str
    old: str | None = None
    new: str | None = None


SOURCE_EDITS = [
    Change(
        ["tensorflow"],
        "source",
        "mnist_tensorflow.py",
        "mnist.load_data(path=.../mnist.npz) replaced by the np.load of that npz that load_data does",
        "load_data checks MNIST's sha256 and re-downloads on a mismatch; "
        "offline, with Fashion-MNIST in the npz, that fails",
        old="""    (x_train, y_train), (x_test, y_test) = mnist.load_data(
        path=os.path.join(cfg.output.data_path, "mnist.npz")
    )
""",
        new=f"""    {MARK} load_data without its MNIST hash check and download
    import numpy as np
    with np.load(os.path.join(cfg.output.data_path, "mnist.npz"), allow_pickle=True) as f:
        (x_train, y_train), (x_test, y_test) = (f["x_train"], f["y_train"]), (f["x_test"], f["y_test"])
""",
    ),
    Change(
        ["jax"],
        "source",
        "mnist_jax.py",
        'checkpoint directory made absolute: os.path.abspath(os.path.join("jax_checkpoints_{}"...))',
        "current orbax raises 'Checkpoint path should be absolute' after epoch 1",
        old='ckpt_dir=os.path.join("jax_checkpoints_{}".format(epoch)),',
        new=f'ckpt_dir=os.path.abspath(os.path.join("jax_checkpoints_{{}}".format(epoch))),  {MARK}',
    ),
]


def fixed_changes(epochs: int, data_dir: Path) -> list[Change]:
    """The changes that are not source edits: shim, environment, command line, data."""
    return [
        Change(
            ["pytorch", "jax"],
            "shim",
            "torchvision/ (next to the scripts)",
            "stand-in torchvision package from benchmarks/reference/standin: "
            "datasets.MNIST, transforms.Compose/ToTensor/Normalize",
            "torchvision cannot import against CPU torch here; "
            "the stand-in keeps the per-sample PIL image -> ToTensor -> Normalize path",
        ),
        Change(
            ["tensorflow"],
            "env",
            "-",
            "TF_USE_LEGACY_KERAS=1 (tf_keras 2.21 installed)",
            "with Keras 3 the script fails: 'Mean' object has no attribute 'reset_states'",
        ),
        Change(
            list(FRAMEWORKS),
            "env",
            "-",
            "WORKSPACE_PATH=<work dir>/<framework>",
            "train.yaml reads ${oc.env:WORKSPACE_PATH}; their run.sh sets it the same way",
        ),
        Change(
            list(FRAMEWORKS),
            "cli",
            "-",
            "--config-path <work dir>/conf --config-name train (their train.yaml, unchanged)",
            "@hydra.main points at /mlcube/workspace, the MLCube container's mount",
        ),
        Change(
            list(FRAMEWORKS),
            "cli",
            "-",
            f"params.n_epochs={epochs}",
            "train.yaml says 4 epochs; the number of epochs to time is chosen here",
        ),
        Change(
            list(FRAMEWORKS),
            "data",
            "-",
            f"Fashion-MNIST ({data_dir}) in MNIST's place: IDX files in data/MNIST/raw, data/mnist.npz for TF",
            "MNIST needs the internet; Fashion-MNIST has the same format, shapes and sizes",
        ),
    ]


def option_changes(train_limit: int | None, test_limit: int | None, torch_threads: int | None) -> list[Change]:
    """The changes made only when asked for: shorter data, a torch thread count."""
    changes = []
    if torch_threads is not None:
        changes.append(
            Change(
                ["pytorch"],
                "env",
                "-",
                f"OMP_NUM_THREADS={torch_threads} (--torch-threads)",
                "torch's intra-op threads, by default one per core, slow down badly on a loaded machine",
            )
        )
    for name, limit in (("training", train_limit), ("test", test_limit)):
        if limit is not None:
            changes.append(
                Change(
                    list(FRAMEWORKS),
                    "data",
                    "-",
                    f"{name} set cut to its first {limit} samples",
                    "--train-limit/--test-limit: short runs for development, not for timing",
                )
            )
    return changes


# ---------------------------------------------------------------- tutorial sources


def read_tutorial_dir(directory: Path) -> dict[str, str]:
    missing = [name for name in TUTORIAL_FILES if not (directory / name).is_file()]
    if missing:
        raise Failure(f"{directory} lacks {', '.join(missing)}: pass a checkout of WolodjaZ/reproduc-ml-tutorial")
    return {name: (directory / name).read_text() for name in TUTORIAL_FILES}


def read_tutorial_git(git_dir: Path) -> dict[str, str]:
    sources = {}
    for name in TUTORIAL_FILES:
        result = subprocess.run(["git", f"--git-dir={git_dir}", "show", f"HEAD:{name}"], capture_output=True, text=True)
        if result.returncode != 0:
            raise Failure(f"git --git-dir={git_dir} show HEAD:{name} failed: {result.stderr.strip() or 'no output'}")
        sources[name] = result.stdout
    return sources


def git_commit(git_dir: Path) -> str | None:
    result = subprocess.run(["git", f"--git-dir={git_dir}", "rev-parse", "HEAD"], capture_output=True, text=True)
    return result.stdout.strip() if result.returncode == 0 else None


def apply_edits(name: str, text: str, edits: list[Change]) -> str:
    for edit in edits:
        count = text.count(edit.old)
        if count != 1:
            raise Failure(
                f"edit no longer applies to {name} (expected text found {count} times, not once): {edit.what}"
            )
        text = text.replace(edit.old, edit.new)
    return text


# ---------------------------------------------------------------- data


def read_idx_gz(path: Path) -> np.ndarray:
    raw = gzip.decompress(path.read_bytes())
    ndim = raw[3]
    shape = tuple(int(n) for n in np.frombuffer(raw, dtype=">u4", count=ndim, offset=4))
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(shape)


def load_fashion(data_dir: Path, train_limit: int | None, test_limit: int | None) -> dict[str, np.ndarray]:
    names = {
        "x_train": "train-images-idx3-ubyte.gz",
        "y_train": "train-labels-idx1-ubyte.gz",
        "x_test": "t10k-images-idx3-ubyte.gz",
        "y_test": "t10k-labels-idx1-ubyte.gz",
    }
    missing = [n for n in names.values() if not (data_dir / n).is_file()]
    if missing:
        raise Failure(
            f"{data_dir} lacks {', '.join(missing)} (Fashion-MNIST IDX files; apt package dataset-fashion-mnist)"
        )
    arrays = {key: read_idx_gz(data_dir / name) for key, name in names.items()}
    for split, limit in (("train", train_limit), ("test", test_limit)):
        if limit is not None:
            arrays[f"x_{split}"] = arrays[f"x_{split}"][:limit]
            arrays[f"y_{split}"] = arrays[f"y_{split}"][:limit]
    return arrays


def write_idx(path: Path, array: np.ndarray) -> None:
    """Uncompressed IDX of unsigned bytes, as torchvision keeps MNIST in MNIST/raw."""
    header = np.array([0x800 + array.ndim, *array.shape], dtype=">u4")
    path.write_bytes(header.tobytes() + np.ascontiguousarray(array, dtype=np.uint8).tobytes())


def write_data(framework: str, workspace: Path, arrays: dict[str, np.ndarray]) -> None:
    """Puts the data where the script reads it: data/mnist.npz for TF, data/MNIST/raw IDX files otherwise."""
    data = workspace / "data"
    data.mkdir(parents=True)
    if framework == "tensorflow":
        np.savez(data / "mnist.npz", **arrays)  # keras' layout: uint8 images (N, 28, 28), uint8 labels
        return
    raw = data / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for key, stem in (
        ("x_train", "train-images-idx3-ubyte"),
        ("y_train", "train-labels-idx1-ubyte"),
        ("x_test", "t10k-images-idx3-ubyte"),
        ("y_test", "t10k-labels-idx1-ubyte"),
    ):
        write_idx(raw / stem, arrays[key])


# ---------------------------------------------------------------- running


PATTERNS = {  # (train, test) regexes on the scripts' own log lines; group 1 epoch, group 2 seconds
    "pytorch": (r"Train Epoch: (\d+) ([\d.]+)s", r"Test Epoch: (\d+) ([\d.]+)s"),
    "tensorflow": (r"Epoch (\d+), Time ([\d.]+)s", r"Epoch (\d+), .*Test Time ([\d.]+)s"),
    "jax": (r"train epoch: (\d+), time ([\d.]+)s", r"test epoch: (\d+), time: ([\d.]+)s"),
}


def yaml_param(yaml_text: str, key: str) -> str | None:
    match = re.search(rf"^\s*{key}:\s*([^\s#]+)", yaml_text, re.MULTILINE)
    return match.group(1) if match else None


def threads_setting(framework: str, workers: str | None, torch_threads: int | None) -> str:
    cores = os.cpu_count()
    torch_setting = f"torch default ({cores} cores)" if torch_threads is None else f"OMP_NUM_THREADS={torch_threads}"
    return {
        "pytorch": f"intra-op {torch_setting}, {workers} DataLoader workers",
        "tensorflow": "intra-op 1, inter-op 1 (set by the script)",
        "jax": f"XLA CPU default ({cores} cores), {workers} DataLoader workers",
    }[framework]


def parse_times(framework: str, log: str) -> tuple[list[float], list[float]]:
    train_re, test_re = PATTERNS[framework]
    train = [float(m.group(2)) for m in re.finditer(train_re, log)]
    test = [float(m.group(2)) for m in re.finditer(test_re, log)]
    return train, test


def failure_reason(returncode: int, log: str, epochs: int, train: list, test: list) -> str | None:
    if returncode != 0:
        last = [line for line in log.splitlines() if line.strip()][-1:] or ["(empty log)"]
        return f"exit status {returncode}: {last[0].strip()[:300]}"
    if len(train) != epochs or len(test) != epochs:
        return f"logged {len(train)} train and {len(test)} test times for {epochs} epochs (log format changed?)"
    return None


def run_framework(
    framework: str, python: Path, work: Path, arrays: dict, epochs: int, threads: str, torch_threads: int | None
) -> dict:
    """Runs one script in its own workspace and parses the epoch times from its log."""
    workspace = work / framework
    write_data(framework, workspace, arrays)
    env = dict(os.environ, WORKSPACE_PATH=str(workspace))
    env_shown = {"WORKSPACE_PATH": str(workspace)}
    if framework == "tensorflow":
        env["TF_USE_LEGACY_KERAS"] = env_shown["TF_USE_LEGACY_KERAS"] = "1"
    if framework == "pytorch" and torch_threads is not None:
        env["OMP_NUM_THREADS"] = env_shown["OMP_NUM_THREADS"] = str(torch_threads)
    command = [
        str(python),
        str(work / "src" / FRAMEWORKS[framework]),
        "--config-path",
        str(work / "conf"),
        "--config-name",
        "train",
        f"params.n_epochs={epochs}",
    ]
    log_path = work / f"{framework}.log"
    print(f"running {framework} ({epochs} epochs, log {log_path}) ...", flush=True)
    load_before = os.getloadavg()
    start = time.monotonic()
    with open(log_path, "w") as log_file:
        result = subprocess.run(command, cwd=workspace, env=env, stdout=log_file, stderr=subprocess.STDOUT)
    wall = time.monotonic() - start
    log = log_path.read_text(errors="replace")
    train, test = parse_times(framework, log)
    failure = failure_reason(result.returncode, log, epochs, train, test)
    ok = failure is None
    return {
        "exit_status": result.returncode,
        "ok": ok,
        "failure": failure,
        "train_epoch_s": train,
        "test_epoch_s": test,
        "median_train_s_after_first_epoch": statistics.median(train[1:]) if len(train) > 1 else None,
        "threads": threads,
        "process_wall_s": round(wall, 2),
        "load_avg_before": [round(x, 2) for x in load_before],
        "load_avg_after": [round(x, 2) for x in os.getloadavg()],
        "command": _portable_command(
            " ".join(f"{k}={shlex.quote(v)}" for k, v in env_shown.items()) + " " + shlex.join(command), workspace
        ),
        "cwd": workspace.name,  # committed: no absolute paths
        "log_tail": None if ok else log[-4000:],
    }


# ---------------------------------------------------------------- setup and environment facts
def _portable_command(command: str, workspace: Path) -> str:
    """The command as committed: the temporary workspace as WORKSPACE, the repository's paths relative."""
    repository = str(Path(__file__).resolve().parents[1]) + "/"
    return command.replace(str(workspace.parent) + "/", "WORKSPACE/").replace(repository, "")


def _portable(path) -> str:
    """A path as the committed result records it: relative to the repository when inside it, else its name."""
    path = Path(path).resolve()
    try:
        return path.relative_to(Path(__file__).resolve().parents[1]).as_posix()
    except ValueError:
        return f".../{path.name}"


def setup_venv(python: Path, wheels: Path) -> None:
    uv = shutil.which("uv")
    if uv is None:
        raise Failure("--setup needs uv on PATH")
    if not wheels.is_dir():
        raise Failure(f"{wheels} not found: it must hold the torch 2.13.0 CPU wheel (pass --wheels DIR)")
    venv = python.parent.parent
    if not python.exists():
        subprocess.run([uv, "venv", "--python", "3.11", str(venv)], check=True)
    subprocess.run(
        [uv, "pip", "install", "--python", str(python), "--find-links", str(wheels), "-r", str(REQUIREMENTS)],
        check=True,
    )


def venv_versions(python: Path) -> dict:
    code = (
        "import importlib.metadata as m, json, platform\n"
        f"names = {VERSION_PACKAGES!r}\n"
        "def version(n):\n"
        "    try:\n        return m.version(n)\n"
        "    except m.PackageNotFoundError:\n        return None\n"
        "print(json.dumps({'python': platform.python_version(), 'packages': {n: version(n) for n in names}}))\n"
    )
    result = subprocess.run([str(python), "-c", code], capture_output=True, text=True)
    if result.returncode != 0:
        raise Failure(f"{python} cannot run: {result.stderr.strip().splitlines()[-1:]}")
    return json.loads(result.stdout)


def machine() -> dict:
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    return {"cpu": cpu, "cores": os.cpu_count(), "platform": platform.platform()}


# ---------------------------------------------------------------- report


def print_change(change: Change) -> None:
    where = f"{change.file}: " if change.kind in ("source", "shim") else ""
    print(f"    [{change.kind}] {where}{change.what}\n        why: {change.why}")


def print_changes(changes: list[Change], frameworks: list[str]) -> None:
    print("Changes from running the tutorial as published (data: Fashion-MNIST in MNIST's place):")
    common = [c for c in changes if set(frameworks) <= set(c.applies_to)]
    print(f"  every script run ({', '.join(FRAMEWORKS[f] for f in frameworks)}):")
    for change in common:
        print_change(change)
    for framework in frameworks:
        own = [c for c in changes if framework in c.applies_to and c not in common]
        if own:
            print(f"  {FRAMEWORKS[framework]} only:")
            for change in own:
                print_change(change)


def fmt(values: list[float]) -> str:
    return " ".join(f"{v:.2f}" for v in values) or "-"


def print_table(results: dict, epochs: int, batch: str | None) -> None:
    print(
        "\n| framework | epochs | train s per epoch | test s per epoch "
        "| median train s (epochs >= 2) | batch | threads | exit |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for framework, r in results.items():
        later = r["train_epoch_s"][1:]
        median = f"{statistics.median(later):.2f}" if later else "-"
        print(
            f"| {framework} | {epochs} | {fmt(r['train_epoch_s'])} | {fmt(r['test_epoch_s'])} | {median} | {batch} | "
            f"{r['threads']} | {r['exit_status']}{'' if r['ok'] else ' FAILED'} |"
        )
    print("\nCommands (cwd = the framework's workspace):")
    for framework, r in results.items():
        print(f"  {framework}: {r['command']}")


# ---------------------------------------------------------------- main


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--tutorial", type=Path, help="checkout holding mnist_*.py and workspace/train.yaml")
    source.add_argument("--tutorial-git", type=Path, help="git directory of the tutorial (files read from HEAD)")
    parser.add_argument("--frameworks", default="pytorch,tensorflow,jax")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--train-limit", type=int, help="use only the first N training samples (development)")
    parser.add_argument("--test-limit", type=int, help="use only the first N test samples (development)")
    parser.add_argument(
        "--torch-threads", type=int, help="set OMP_NUM_THREADS for mnist_pytorch.py (listed as a change)"
    )
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="Fashion-MNIST IDX .gz directory")
    parser.add_argument("--python", type=Path, default=DEFAULT_PYTHON, help="python of the reference venv")
    parser.add_argument("--out", type=Path, default=Path("reference-results.json"))
    parser.add_argument(
        "--setup", action="store_true", help="create/update the reference venv from requirements.in with uv"
    )
    parser.add_argument(
        "--wheels", type=Path, default=DEFAULT_WHEELS, help="--setup: directory with the torch CPU wheel"
    )
    parser.add_argument("--keep", action="store_true", help="keep the temporary work dir")
    return parser.parse_args()


def check_args(args: argparse.Namespace) -> list[str]:
    frameworks = [f.strip() for f in args.frameworks.split(",") if f.strip()]
    unknown = [f for f in frameworks if f not in FRAMEWORKS]
    if unknown or not frameworks:
        raise Failure(f"unknown framework(s) {unknown or frameworks}: choose from {','.join(FRAMEWORKS)}")
    if args.tutorial is None and args.tutorial_git is None:
        raise Failure("pass --tutorial DIR or --tutorial-git GITDIR")
    if args.epochs < 1:
        raise Failure("--epochs must be at least 1")
    for name in ("train_limit", "test_limit", "torch_threads"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise Failure(f"--{name.replace('_', '-')} must be at least 1")
    if not args.python.exists():
        raise Failure(f"{args.python} not found: create the reference venv with --setup (or pass --python PATH)")
    return frameworks


def prepare_work(work: Path, sources: dict[str, str], frameworks: list[str]) -> None:
    (work / "src").mkdir()
    (work / "conf").mkdir()
    (work / "conf" / "train.yaml").write_text(sources["workspace/train.yaml"])
    for framework in frameworks:
        name = FRAMEWORKS[framework]
        edits = [e for e in SOURCE_EDITS if e.file == name]
        (work / "src" / name).write_text(apply_edits(name, sources[name], edits))
    if {"pytorch", "jax"} & set(frameworks):
        shutil.copytree(STANDIN_TORCHVISION, work / "src" / "torchvision", ignore=shutil.ignore_patterns("__pycache__"))


def run(args: argparse.Namespace) -> int:
    frameworks = check_args(args)
    if args.tutorial_git is not None:
        sources, commit = read_tutorial_git(args.tutorial_git), git_commit(args.tutorial_git)
    else:
        sources = read_tutorial_dir(args.tutorial)
        commit = git_commit(args.tutorial / ".git") if (args.tutorial / ".git").exists() else None
    versions = venv_versions(args.python)
    arrays = load_fashion(args.data, args.train_limit, args.test_limit)
    changes = (
        SOURCE_EDITS
        + fixed_changes(args.epochs, args.data)
        + option_changes(args.train_limit, args.test_limit, args.torch_threads)
    )
    work = Path(tempfile.mkdtemp(prefix="reference-tutorial-"))
    try:
        prepare_work(work, sources, frameworks)
        print_changes(changes, frameworks)
        results = {}
        workers = yaml_param(sources["workspace/train.yaml"], "num_workers")
        for framework in frameworks:
            threads = threads_setting(framework, workers, args.torch_threads)
            results[framework] = run_framework(
                framework, args.python, work, arrays, args.epochs, threads, args.torch_threads
            )
    finally:
        if args.keep:
            print(f"work dir kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    yaml_text = sources["workspace/train.yaml"]
    batch = f"{yaml_param(yaml_text, 'batch_size_train')} train / {yaml_param(yaml_text, 'batch_size_test')} test"
    print_table(results, args.epochs, batch)
    report = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(),
        "venv": {"python_path": _portable(args.python), **versions},
        "tutorial": {
            "repository": "github.com/WolodjaZ/reproduc-ml-tutorial",
            "commit": commit,
            "source": _portable(args.tutorial_git or args.tutorial),
            "sha256": {name: hashlib.sha256(text.encode()).hexdigest() for name, text in sources.items()},
        },
        "data": {
            "dataset": "Fashion-MNIST in MNIST's place",
            "dir": _portable(args.data),
            "train_samples": len(arrays["y_train"]),
            "test_samples": len(arrays["y_test"]),
        },
        "epochs": args.epochs,
        "batch_size_train": int(yaml_param(yaml_text, "batch_size_train")),
        "batch_size_test": int(yaml_param(yaml_text, "batch_size_test")),
        "edits": [asdict(c) for c in changes if set(c.applies_to) & set(frameworks)],
        "results": results,
    }
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nwrote {args.out}")
    failed = [f for f, r in results.items() if not r["ok"]]
    for framework in failed:
        print(f"FAILED {framework}: {results[framework]['failure']} (log tail in {args.out})", file=sys.stderr)
    if failed:
        return 1
    return 0


def main() -> int:
    args = parse_args()
    try:
        if args.setup:
            setup_venv(args.python, args.wheels)
            if args.tutorial is None and args.tutorial_git is None:
                return 0
        return run(args)
    except Failure as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
