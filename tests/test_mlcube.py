"""The MLCube packaging: run.sh (the image entrypoint), mlcube.yaml, Singularity.recipe, driven by the
real mlcube 0.0.9 CLI. The Singularity runner's argv (what mlcube asks of singularity, and when) is
checked through a stub `singularity` that records it and emulates `run` natively; the real Apptainer runs
the tasks in test_apptainer.py, and the Docker tests are in test_container.py."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest
import yaml

from reprocube.training.backend import FRAMEWORKS

from helpers import error_lines

REPO = Path(__file__).resolve().parents[1]
RUN_SH = REPO / "run.sh"
MLCUBE_VENV = REPO / ".venv-mlcube"
MLCUBE = Path(os.environ.get("REPROCUBE_MLCUBE", MLCUBE_VENV / "bin" / "mlcube"))
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
BIN = Path(sys.executable).parent  # the venv whose `reprocube` run.sh calls when run natively


def run_sh(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}"}
    return subprocess.run(["bash", str(RUN_SH), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.process
@pytest.mark.parametrize(
    "args, message",
    [
        (
            (),
            (
                "run.sh: error: no task given; expected one of: "
                "download pytorch tensorflow jax verify compare reproduce report bench study check"
            ),
        ),
        (
            ("train",),
            (
                "run.sh: error: unknown task 'train'; expected one of: "
                "download pytorch tensorflow jax verify compare reproduce report bench study check"
            ),
        ),
        (
            ("pytorch", "--parameters_file=p.yaml", "--data_dir=d"),
            "run.sh: error: task pytorch: missing parameter --runs_dir",
        ),
        (
            ("pytorch", "--parameters_file=p.yaml", "--data_dir=d", "--runs_dir=r", "--seed=3"),
            (
                "run.sh: error: task pytorch: unknown parameter --seed "
                "(this task takes: parameters_file data_dir runs_dir)"
            ),
        ),
        (("jax", "seed=3"), "run.sh: error: task jax: unexpected argument 'seed=3' (expected --name=path)"),
        (("report", "--runs_dir=a", "--runs_dir=b"), "run.sh: error: task report: parameter --runs_dir given twice"),
        (
            ("tensorflow", "--parameters_file=absent.yaml", "--data_dir=d", "--runs_dir=r"),
            (
                "run.sh: error: task tensorflow: parameters file absent.yaml not found "
                "(check the parameters_file/verify_file/study_file parameter)"
            ),
        ),
        (
            ("report", "--runs_dir=empty", "--report_dir=out"),
            "run.sh: error: task report: no runs in empty (run a training task first)",
        ),
    ],
)
def test_run_sh_refuses_bad_invocations_with_one_line(tmp_path, args, message):
    (tmp_path / "empty").mkdir()
    result = run_sh(*args, cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [message]
    assert not (tmp_path / "r").exists()


@pytest.mark.process
def test_run_sh_passes_reprocube_errors_and_status_through(tmp_path):
    (tmp_path / "train.yaml").write_text("epochz: 3\n")
    result = run_sh("pytorch", "--parameters_file=train.yaml", "--data_dir=data", "--runs_dir=runs", cwd=tmp_path)
    assert result.returncode == 2
    assert error_lines(result)[0].startswith("reprocube: error: invalid configuration")


# ---- mlcube.yaml, Dockerfile, Singularity.recipe agree with each other --------------------------------------


def test_image_names_and_versions_agree_across_files():
    cube = yaml.safe_load((REPO / "mlcube.yaml").read_text())
    assert cube["docker"]["image"] == f"reprocube/reprocube:{VERSION}-gpu"
    assert cube["singularity"]["image"] == f"reprocube-{VERSION}-gpu.sif"
    dockerfile = (REPO / "Dockerfile").read_text()
    assert f"REPROCUBE_IMAGE=reprocube/reprocube:{VERSION}-${{VARIANT}}" in dockerfile
    assert re.search(r"^ARG BASE_IMAGE=\S+@sha256:[0-9a-f]{64}$", dockerfile, re.M), (
        "the base image must be pinned by digest"
    )
    assert 'ENTRYPOINT ["/usr/bin/tini", "--", "/opt/reprocube/run.sh"]' in dockerfile
    # The recipe builds either variant (--build-arg VARIANT=cpu); by default the one mlcube.yaml names.
    recipe = (REPO / "Singularity.recipe").read_text()
    assert f"From: reprocube/reprocube:{VERSION}-{{{{ VARIANT }}}}" in recipe
    assert re.search(r"^%arguments\n    VARIANT=gpu$", recipe, re.M)


def test_every_task_declares_what_run_sh_expects():
    """mlcube passes one --name per declared parameter; run.sh refuses any other set. Checked by
    calling run.sh with exactly the declared names: only a missing file or data error may follow."""
    cube = yaml.safe_load((REPO / "mlcube.yaml").read_text())
    assert set(cube["tasks"]) == {
        "download",
        *FRAMEWORKS,
        "verify",
        "compare",
        "reproduce",
        "report",
        "bench",
        "study",
        "check",
    }
    script = RUN_SH.read_text()
    for task, spec in cube["tasks"].items():
        names = [*spec["parameters"]["inputs"], *spec["parameters"]["outputs"]]
        expected = re.search(rf"^  (?:[a-z]+ \| )*{task}(?: \| [a-z]+)*\)\n    expect ([a-z_ ]+)$", script, re.M)
        assert expected, f"run.sh has no case for {task}"
        assert sorted(expected.group(1).split()) == sorted(names), task
        for name, param in {**spec["parameters"]["inputs"], **spec["parameters"]["outputs"]}.items():
            assert param["type"] in ("file", "directory"), (task, name)


def test_the_workspace_parameter_files_are_valid_configs(tmp_path):
    from reprocube.config import config_files_overrides, load_config
    from reprocube.orchestration.invocation import frameworks_from

    train, verify = str(REPO / "workspace" / "train.yaml"), str(REPO / "workspace" / "verify.yaml")
    cfg = load_config(["framework=jax"], [train])
    assert (cfg.framework.name, cfg.deterministic) == ("jax", True)
    frameworks, _ = frameworks_from([], config_files_overrides([train, verify]))
    assert frameworks == list(FRAMEWORKS)
    assert load_config(["framework=pytorch"], [train, verify]).verify.mid_epoch is True
    study = load_config([], [train, str(REPO / "workspace" / "study.yaml")])
    assert (study.framework.name, study.study.runs, study.epochs) == ("pytorch", 3, 4)


# ---- the Singularity runner's argv: the real mlcube CLI, a stub `singularity` (the real one: test_apptainer.py) --

# Records its argv; `build` creates the SIF; `run` emulates the container natively: each --bind HOST:/mlcube_ioN
# is mapped back to HOST in the task arguments, and the recipe's runscript (run.sh) is executed.
STUB = textwrap.dedent(
    """\
    #!{python}
    import json, os, sys
    with open({log!r}, "a") as log:
        log.write(json.dumps({{"argv": sys.argv[1:], "cwd": os.getcwd()}}) + "\\n")
    args = sys.argv[1:]
    if args[:1] == ["--version"]:
        print("singularity version 3.8.7")
    elif args[:1] == ["build"]:
        open(args[-2], "w").close()
    elif args[:1] == ["run"]:
        binds, i = {{}}, 1
        while args[i].startswith("-"):
            if args[i] == "--bind":
                host, inside = args[i + 1].split(":")[:2]
                binds[inside] = host
                i += 2
            else:
                i += 1
        task_args = args[i + 1 :]
        for inside, host in sorted(binds.items(), key=lambda kv: -len(kv[0])):
            task_args = [a.replace("=" + inside, "=" + host) for a in task_args]
        os.execvp("bash", ["bash", {run_sh!r}, *task_args])
    """
)


@pytest.fixture
def singularity_stub(tmp_path):
    stub_dir = tmp_path / "stub"
    stub_dir.mkdir()
    log = tmp_path / "singularity-argv.jsonl"
    stub = stub_dir / "singularity"
    stub.write_text(STUB.format(python=sys.executable, log=str(log), run_sh=str(RUN_SH)))
    stub.chmod(0o755)
    return stub_dir, log


def mlcube(*args: str, path_prefix: Path | None = None, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    if not MLCUBE.exists():
        pytest.fail(f"{MLCUBE} is missing: `make setup` installs the MLCube launcher into {MLCUBE_VENV}")
    path = f"{path_prefix}:{BIN}:{os.environ['PATH']}" if path_prefix else f"{BIN}:{os.environ['PATH']}"
    env = {**os.environ, "PATH": path, "HOME": str(cwd)}  # mlcube writes its settings file into $HOME
    return subprocess.run([str(MLCUBE), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def generated_dataset_config(generated) -> dict:
    """The generated dataset's pins as a nested parameters-file mapping."""
    config: dict = {}
    for override in generated.overrides():
        key, value = override.split("=", 1)
        if key.startswith("dataset."):
            node = config
            *parents, leaf = key.split(".")
            for part in parents:
                node = node.setdefault(part, {})
            node[leaf] = yaml.safe_load(value)
    return config


@pytest.mark.process
def test_mlcube_singularity_runner_builds_once_and_runs_the_task_with_binds_and_nv(
    tmp_path, singularity_stub, generated
):
    stub_dir, log = singularity_stub
    workspace, image_dir = tmp_path / "workspace", tmp_path / "image"
    workspace.mkdir()
    # The generated dataset, imported by the download task from workspace/source.
    generated.write_gz(workspace / "source")
    (workspace / "train.yaml").write_text(
        yaml.safe_dump({**generated_dataset_config(generated), "epochs": 1, "threads": 1})
    )

    common = [
        f"--mlcube={REPO}",
        "--platform=singularity",
        f"--workspace={workspace}",
        "--",
        f"-Psingularity.image_dir={image_dir}",
    ]
    download = mlcube("run", "--task=download", *common, path_prefix=stub_dir, cwd=tmp_path)
    assert download.returncode == 0, download.stdout + download.stderr
    train = mlcube("run", "--task=pytorch", *common, path_prefix=stub_dir, cwd=tmp_path)
    assert train.returncode == 0, train.stdout + train.stderr

    calls = [json.loads(line) for line in log.read_text().splitlines()]
    builds = [c for c in calls if c["argv"][:1] == ["build"]]
    runs = [c for c in calls if c["argv"][:1] == ["run"]]
    sif = str(image_dir / f"reprocube-{VERSION}-gpu.sif")
    assert builds == [{"argv": ["build", "--fakeroot", sif, "Singularity.recipe"], "cwd": str(REPO)}], (
        "built exactly once, from the recipe"
    )
    ws = str(workspace)
    assert [r["argv"] for r in runs] == [
        [
            "run",
            "--nv",
            f"--bind={image_dir}:{image_dir}:ro",
            "--bind",
            f"{ws}:/mlcube_io0",
            "--bind",
            f"{ws}/source:/mlcube_io1",
            "--bind",
            f"{ws}/data:/mlcube_io2",
            sif,
            "download",
            "--parameters_file=/mlcube_io0/train.yaml",
            "--source_dir=/mlcube_io1",
            "--data_dir=/mlcube_io2",
        ],
        [
            "run",
            "--nv",
            f"--bind={image_dir}:{image_dir}:ro",
            "--bind",
            f"{ws}:/mlcube_io0",
            "--bind",
            f"{ws}/data:/mlcube_io1",
            "--bind",
            f"{ws}/runs:/mlcube_io2",
            sif,
            "pytorch",
            "--parameters_file=/mlcube_io0/train.yaml",
            "--data_dir=/mlcube_io1",
            "--runs_dir=/mlcube_io2",
        ],
    ]

    # The emulated runscript really trained: the run and its manifest are in the workspace.
    from reprocube.training.checkpoint import latest_checkpoint, read_checkpoint

    final = latest_checkpoint(workspace / "runs" / "pytorch-seed0" / "checkpoints")
    assert final is not None and final.name == "epoch-0001"
    assert read_checkpoint(final).manifest.weights_digest


@pytest.mark.process
def test_singularity_recipe_parses_and_runs_the_entrypoint():
    """Parsed with spython (the launcher's venv has it). Apptainer itself builds and runs it in
    test_apptainer.py; spython knows no {{ VARIANT }} templating (it lowercases the From: line)."""
    code = textwrap.dedent(
        """\
        import json, sys
        from spython.main.parse.parsers import SingularityParser
        (recipe,) = SingularityParser(sys.argv[1]).recipe.values()  # one stage
        print(
            json.dumps(
                {"from": recipe.fromHeader, "environ": recipe.environ, "runscript": recipe.cmd, "labels": recipe.labels}
            )
        )
        """
    )
    result = subprocess.run(
        [str(MLCUBE_VENV / "bin" / "python"), "-c", code, str(REPO / "Singularity.recipe")],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    parsed = json.loads(result.stdout)
    assert parsed["from"] == f"reprocube/reprocube:{VERSION}-{{{{ variant }}}}"
    assert {"PYTHONNOUSERSITE=1", "PYTHONHASHSEED=0", "PATH=/opt/venv/bin:$PATH"} <= set(parsed["environ"])
    assert parsed["runscript"] == 'exec /opt/reprocube/run.sh "$@"'
    assert f"org.opencontainers.image.version {VERSION}" in parsed["labels"]
    header = (REPO / "Singularity.recipe").read_text()
    assert re.search(r"^Bootstrap: docker-daemon$", header, re.M)
