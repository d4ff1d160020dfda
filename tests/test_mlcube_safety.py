"""Issue 15: no shell between `mlcube run` and docker/singularity, and no grammar between a path and
reprocube. The real mlcube 0.0.9 launcher of .venv-mlcube (patched by scripts/reprocube_mlcube_noshell.py,
which `make setup` installs) drives stub `docker`/`singularity` executables that record their argv; run.sh
(the image entrypoint) runs natively, against a stub `reprocube` that records its argv or the real one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from reprocube.cli import parser_for
from reprocube.config import load_config
from test_mlcube import generated_dataset_config

pytestmark = pytest.mark.process  # every test here starts a process: not in make test-quick

REPO = Path(__file__).resolve().parents[1]
RUN_SH = REPO / "run.sh"
MLCUBE = Path(os.environ.get("REPROCUBE_MLCUBE", REPO / ".venv-mlcube" / "bin" / "mlcube"))
BIN = Path(sys.executable).parent

# A shell would run this; as a path it is a directory name.
INJECTION = "x$(touch pwned)"
# Every character that was grammar somewhere: the shell, Hydra's override grammar, OmegaConf's interpolation.
STRANGE = "a (b)=c,d $HOME ${oc.env:HOME} 'q' \"dq\" e\\${x} [f]{g}:h \\"

RECORDER = textwrap.dedent(
    """\
    #!{python}
    import json, sys
    with open({log!r}, "a") as log:
        log.write(json.dumps(sys.argv[1:]) + "\\n")
    if sys.argv[1:2] == ["--version"]:
        print("singularity version 3.8.7")
    """
)


def recorder(directory: Path, name: str, log: Path) -> None:
    directory.mkdir(exist_ok=True)
    stub = directory / name
    stub.write_text(RECORDER.format(python=sys.executable, log=str(log)))
    stub.chmod(0o755)


def calls(log: Path) -> list[list[str]]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def mlcube(*args: str, tmp_path: Path) -> tuple[subprocess.CompletedProcess, list[list[str]]]:
    """The real launcher, with stub docker and singularity first on PATH; returns their recorded argvs."""
    if not MLCUBE.exists():
        pytest.fail(f"{MLCUBE} is missing: `make setup` installs the MLCube launcher")
    stubs, log = tmp_path / "stub", tmp_path / "argv.jsonl"
    recorder(stubs, "docker", log)
    recorder(stubs, "singularity", log)
    env = {**os.environ, "PATH": f"{stubs}:{BIN}:{os.environ['PATH']}", "HOME": str(tmp_path)}
    result = subprocess.run(
        [str(MLCUBE), "run", f"--mlcube={REPO}", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return result, calls(log)


def no_pwned_file(tmp_path: Path) -> bool:
    return not [p for p in tmp_path.rglob("*") if p.name == "pwned"] and not (REPO / "pwned").exists()


def test_the_launcher_has_the_noshell_patch_active():
    check = subprocess.run(
        [str(MLCUBE.parent / "python"), "-c", "import reprocube_mlcube_noshell as m; m.check_active()"],
        capture_output=True,
        text=True,
    )
    assert check.returncode == 0, check.stderr


@pytest.mark.parametrize("platform, option", [("docker", "--volume"), ("singularity", "--bind")])
def test_a_shell_injection_parameter_runs_nothing_and_reaches_the_runtime_as_one_argument(tmp_path, platform, option):
    workspace = tmp_path / "work space"
    runs, data = tmp_path / INJECTION, tmp_path / "data dir"
    result, argvs = mlcube(
        f"--platform={platform}",
        "--task=pytorch",
        f"--workspace={workspace}",
        f"runs_dir={runs}",
        f"data_dir={data}",
        "--",
        f"-Psingularity.image_dir={tmp_path / 'image'}",
        tmp_path=tmp_path,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert no_pwned_file(tmp_path), "the parameter was run by a shell"
    (run,) = [argv for argv in argvs if argv[:1] in (["run"], ["exec"])]
    # Each path is one argument, exactly as given (a shell would have split "work space" and "data dir").
    assert [option, f"{workspace}:/mlcube_io0"] == run[run.index(f"{workspace}:/mlcube_io0") - 1 :][:2]
    assert f"{data}:/mlcube_io1" in run and f"{runs}:/mlcube_io2" in run
    assert run[-3:] == ["--parameters_file=/mlcube_io0/train.yaml", "--data_dir=/mlcube_io1", "--runs_dir=/mlcube_io2"]
    assert runs.is_dir() and data.is_dir()
    if platform == "docker":
        # mlcube.yaml's --user=$(id -u):$(id -g), produced without a shell: files belong to the invoking user.
        assert f"--user={os.geteuid()}:{os.getegid()}" in run
        assert run[:3] == ["run", "--rm", "--gpus=all"]


@pytest.mark.parametrize(
    "params, message",
    [
        (
            ["--", "-Pdocker.cpu_args=--rm $(touch pwned)", "-Pplatform.accelerator_count=0"],
            "mlcube: error: docker.cpu_args = '--rm $(touch pwned)': '$' needs a shell",
        ),
        (
            ["--", "-Pdocker.gpu_args=--rm `touch pwned`"],
            "mlcube: error: docker.gpu_args = '--rm `touch pwned`': '`' needs a shell",
        ),
        (
            ["--", "-Pdocker.gpu_args=--rm;touch pwned"],
            "mlcube: error: docker.gpu_args = '--rm;touch pwned': ';' needs a shell",
        ),
        (["runs_dir=a:b"], "mlcube: error: host path '{ws}/a:b' holds ':', which docker --volume would split on"),
        (
            ["--", "-Pdocker.image=--privileged"],
            "mlcube: error: docker.image = '--privileged': would read as an option",
        ),
    ],
)
def test_a_value_that_needs_a_shell_or_splits_wrongly_is_refused_in_one_line(tmp_path, params, message):
    workspace = tmp_path / "ws"
    result, argvs = mlcube(
        "--platform=docker", "--task=pytorch", f"--workspace={workspace}", *params, tmp_path=tmp_path
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert len(result.stderr.splitlines()) == 1, result.stderr
    assert result.stderr.startswith(message.format(ws=workspace)), result.stderr
    assert argvs == [], "nothing may run after a refusal"
    assert no_pwned_file(tmp_path)
    assert not (workspace / "a:b").exists()


# ---- run.sh: every path reaches reprocube as a literal -------------------------------------------------------


def run_sh(*args: str, cwd: Path, stub: Path | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    path = f"{stub}:{BIN}:{os.environ['PATH']}" if stub else f"{BIN}:{os.environ['PATH']}"
    return subprocess.run(
        ["bash", str(RUN_SH), *args],
        cwd=cwd,
        env={**os.environ, **(env or {}), "PATH": path},
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture
def stub_reprocube(tmp_path):
    stubs, log = tmp_path / "stub", tmp_path / "reprocube-argv.jsonl"
    recorder(stubs, "reprocube", log)
    return stubs, log


CONFIG_TASKS = {
    # task: (its parameters other than the parameters file(s), {config key: parameter})
    "pytorch": (["data_dir", "runs_dir"], {"data_dir": "data_dir", "output_dir": "runs_dir"}),
    "verify": (["data_dir", "runs_dir"], {"data_dir": "data_dir", "output_dir": "runs_dir"}),
    "bench": (["data_dir", "bench_dir"], {"data_dir": "data_dir", "bench.out": "bench_dir"}),
    "study": (["data_dir", "study_dir"], {"data_dir": "data_dir", "study.dir": "study_dir"}),
    "download": (["source_dir", "data_dir"], {"data_dir": "data_dir", "data.source_dir": "source_dir"}),
}


@pytest.mark.parametrize("task", CONFIG_TASKS)
@pytest.mark.parametrize("strange", [STRANGE, INJECTION, "--help", "${oc.env:HOME}"])
def test_run_sh_passes_every_path_to_reprocube_literally(tmp_path, stub_reprocube, task, strange):
    stubs, log = stub_reprocube
    names, keys = CONFIG_TASKS[task]
    # A parameters file named like an option: a value, not --print-config.
    (tmp_path / "--print-config").write_text("epochs: 1\n")
    (tmp_path / "verify.yaml").write_text("{}\n")
    # Relative paths, so that one can also start with "--" or "${".
    params = {name: f"{strange}/{name}" for name in names}
    source = tmp_path / params.get("source_dir", "src")
    source.mkdir(parents=True)
    (source / "file").touch()  # a non-empty source directory is imported
    files = ["--parameters_file=--print-config"]
    files += {"verify": ["--verify_file=verify.yaml"], "study": ["--study_file=verify.yaml"]}.get(task, [])
    result = run_sh(task, *files, *[f"--{name}={value}" for name, value in params.items()], cwd=tmp_path, stub=stubs)
    assert result.returncode == 0, result.stderr
    (argv,) = calls(log)
    args = parser_for(argv).parse_args(argv)
    assert args.print_config is False and args.config_file[0] == "--print-config"
    cfg = load_config(args.overrides, [str(tmp_path / f) for f in args.config_file])
    for key, name in keys.items():
        assert OmegaConf.select(cfg, key) == params[name], key
    assert cfg.epochs == 1


@pytest.mark.parametrize("task", ["compare", "report"])
def test_run_sh_passes_run_directories_as_positionals(tmp_path, stub_reprocube, task):
    stubs, log = stub_reprocube
    if task == "compare":
        result = run_sh("compare", "--run_a=--help", f"--run_b={STRANGE}", "--report_dir=-o", cwd=tmp_path, stub=stubs)
        expected = ["compare", "--out=-o", "--", "--help", STRANGE]
    else:
        (tmp_path / "--runs" / "--help").mkdir(parents=True)
        (tmp_path / "--runs" / "--help" / "config.yaml").touch()
        result = run_sh("report", "--runs_dir=--runs", "--report_dir=-o", cwd=tmp_path, stub=stubs)
        expected = ["report", "--out=-o", "--", "--runs/--help"]
    assert result.returncode == 0, result.stderr
    (argv,) = calls(log)
    assert argv == expected
    args = parser_for(argv).parse_args(argv)
    assert str(args.out) == "-o"
    assert [str(p) for p in ([args.run_a, args.run_b] if task == "compare" else args.runs)] == expected[3:]


def test_run_sh_compare_with_an_option_as_a_run_does_not_print_help(tmp_path):
    result = run_sh("compare", "--run_a=--help", "--run_b=b", "--report_dir=out", cwd=tmp_path)
    assert result.returncode != 0, result.stdout
    assert "usage:" not in result.stdout + result.stderr
    assert "--help" in result.stderr  # reprocube reports the run directory it could not read


def test_run_sh_trains_into_a_directory_named_literally(tmp_path, generated):
    """End to end with the real reprocube: a run directory whose name holds every grammar character
    gets the run, and nothing is written where an interpolation would point ($HOME is a directory here)."""
    home = tmp_path / "home"
    home.mkdir()
    workspace = tmp_path / "ws"
    generated.write_gz(workspace / "source")
    (workspace / "train.yaml").write_text(
        yaml.safe_dump({**generated_dataset_config(generated), "epochs": 1, "threads": 1})
    )
    data, runs = workspace / f"data {STRANGE}", workspace / f"runs {STRANGE}"
    env = {"HOME": str(home), "PYTHONHASHSEED": "0"}
    download = run_sh(
        "download", "--parameters_file=train.yaml", "--source_dir=source", f"--data_dir={data}", cwd=workspace, env=env
    )
    assert download.returncode == 0, download.stderr
    train = run_sh(
        "pytorch", "--parameters_file=train.yaml", f"--data_dir={data}", f"--runs_dir={runs}", cwd=workspace, env=env
    )
    assert train.returncode == 0, train.stderr
    assert (runs / "pytorch-seed0" / "checkpoints" / "epoch-0001").is_dir()
    assert sorted(p.name for p in workspace.iterdir()) == sorted(["source", "train.yaml", data.name, runs.name])
    assert list(home.iterdir()) == []
