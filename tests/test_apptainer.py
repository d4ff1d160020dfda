"""Singularity for real: Apptainer 1.4.5 (scripts/apptainer-setup.sh), the CPU image's SIF built from our
Singularity.recipe by MLCube's own configure step (scripts/sif.sh: once per Docker image digest, shared by
every test and every `make test` until the image changes), and the MLCube tasks run by
`mlcube run --platform=singularity`. Each training task's weights equal, bit for bit, a native run's and a
Docker run's of the same config (test_container.py's tiny one) on this machine. `make test` and .ci/run set
REPROCUBE_APPTAINER_TESTS=1, which turns a missing prerequisite from a skip into a failure."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from reprocube.training.backend import FRAMEWORKS
from test_container import CPU, FASHION_MNIST, IMAGE, MLCUBE, TRAIN, final_digests

pytestmark = pytest.mark.process  # every test here starts a process: not in make test-quick

REPO = Path(__file__).resolve().parents[1]
SIF_SH = REPO / "scripts" / "sif.sh"
# The shared SIF cache (the MLCube's default image folder); scripts/sif.sh names each SIF by image digest.
IMAGE_DIR = REPO / ".image"
CHECK_YAML = {
    "command": ["python", "numpy_sgd.py", "--epochs", "4", "--sleep", "0.1", "--save-rng"],
    "output": ["final.npz", "metrics.csv"],
    "seed_env": "SEED",
    "at_line": "saved",
}


def _not_ready() -> str | None:
    if os.geteuid() != 0:
        return "the test Apptainer (scripts/apptainer-wrapper.sh) needs root"
    if shutil.which("apptainer") is None or shutil.which("singularity") is None:
        return "apptainer is not installed (make apptainer-setup)"
    if (
        shutil.which("docker") is None
        or subprocess.run(["docker", "image", "inspect", IMAGE], capture_output=True).returncode
    ):
        return f"the Docker image {IMAGE} is not built (make container-setup)"
    if not FASHION_MNIST.is_dir():
        return f"{FASHION_MNIST} is missing (Debian package dataset-fashion-mnist)"
    if not MLCUBE.exists():
        return f"{MLCUBE} is missing (make setup)"
    return None


@pytest.fixture(scope="module", autouse=True)
def ready():
    reason = _not_ready()
    if reason and os.environ.get("REPROCUBE_APPTAINER_TESTS") == "1":
        pytest.fail(f"Apptainer tests required but {reason}")
    if reason:
        pytest.skip(f"{reason}: make apptainer-setup and make container-setup prepare them (.ci/run does)")


def apptainer_version() -> str:
    return subprocess.run(["apptainer", "--version"], capture_output=True, text=True, check=True).stdout.split()[-1]


@pytest.fixture(scope="module")
def sif() -> Path:
    return built_sif()


def built_sif() -> Path:
    """The CPU image's SIF: built by `mlcube configure` the first time this image digest is seen (also by
    test_slurm.py's job in the SIF; scripts/sif.sh lets one build at a time)."""
    started = time.perf_counter()
    # zstd: half the build's time here (gzip, Apptainer's default, for SIFs that go to older kernels).
    built = subprocess.run(
        [str(SIF_SH), "cpu", str(IMAGE_DIR)],
        capture_output=True,
        text=True,
        timeout=1800,
        env={**os.environ, "SIF_COMPRESSION": "zstd"},
    )
    assert built.returncode == 0, built.stderr[-3000:]
    path = Path(built.stdout.strip())
    print(
        f"scripts/sif.sh cpu: {path.name} ({path.stat().st_size >> 20} MiB) ready in {time.perf_counter() - started:.1f} s"
    )
    return path


class SingularityCube:
    """A workspace driven by `mlcube run` (root: the test Apptainer needs it) on the singularity platform,
    and on the docker platform for the same tasks."""

    def __init__(self, root: Path, sif: Path):
        self.root, self.sif = root, sif
        self.workspace = root / "workspace"
        self.home = root / "home"
        for directory in (self.workspace / "source", self.home):
            directory.mkdir(parents=True, exist_ok=True)
        for archive in FASHION_MNIST.glob("*.gz"):
            shutil.copy(archive, self.workspace / "source" / archive.name)
        self.write("train.yaml", TRAIN)
        self.results: dict[str, subprocess.CompletedProcess] = {}

    def write(self, name: str, content: dict) -> None:
        (self.workspace / name).write_text(yaml.safe_dump(content))

    def platform_args(self, platform: str) -> list[str]:
        if platform == "docker":
            return CPU
        # The SIF scripts/sif.sh built; were it missing, mlcube would build it the same way.
        return [f"-Psingularity.image={self.sif.name}", f"-Psingularity.image_dir={self.sif.parent}"]

    def popen(self, task: str, *params: str, platform: str = "singularity") -> subprocess.Popen:
        command = [
            str(MLCUBE),
            "run",
            f"--mlcube={REPO}",
            f"--platform={platform}",
            f"--task={task}",
            f"--workspace={self.workspace}",
            *params,
            "--",
            *self.platform_args(platform),
        ]
        env = {"PATH": os.environ["PATH"], "HOME": str(self.home), "LANG": "C.UTF-8"}
        return subprocess.Popen(
            command, cwd=self.root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )

    def run(self, task: str, *params: str, platform: str = "singularity", timeout: float = 900):
        started = time.perf_counter()
        process = self.popen(task, *params, platform=platform)
        output, _ = process.communicate(timeout=timeout)
        print(
            f"mlcube --platform={platform} --task={task} {' '.join(params)}: exit {process.returncode} in {time.perf_counter() - started:.1f} s"
        )
        result = subprocess.CompletedProcess(process.args, process.returncode, output, "")
        self.results[" ".join((platform, task, *params))] = result
        return result


@pytest.fixture(scope="module")
def cube(sif, tmp_path_factory):
    cube = SingularityCube(tmp_path_factory.mktemp("apptainer-cube"), sif)
    for task in ("download", *FRAMEWORKS):
        cube.run(task)
    # The same tasks in Docker, into their own folder, for the three-way comparison.
    for framework in FRAMEWORKS:
        cube.run(framework, "runs_dir=runs-docker", platform="docker")
    # The receipt of the SIF's PyTorch run, published and reproduced in the SIF and in Docker (natively: below).
    published = cube.workspace / "published"
    published.mkdir()
    shutil.copy(cube.workspace / "runs" / "pytorch-seed0" / "receipt.json", published)
    cube.run("reproduce")
    cube.run("reproduce", "report_dir=reports/reproduce-docker", platform="docker")
    # verify's proof (a fresh process per epoch, a SIGTERM mid-epoch) inside the SIF; PyTorch only: the
    # Docker tests verify all three, and this one is about the runtime.
    cube.write("verify.yaml", {"framework": "pytorch", "verify": {"mid_epoch": True}})
    cube.run("verify")
    # A researcher's own script and its check.yaml in workspace/script, checked inside the SIF.
    (cube.workspace / "script").mkdir()
    shutil.copy(REPO / "examples" / "numpy_sgd.py", cube.workspace / "script")
    (cube.workspace / "script" / "check.yaml").write_text(yaml.safe_dump(CHECK_YAML))
    cube.run("check")
    return cube


def test_apptainer_on_path_is_the_real_one():
    for name in ("apptainer", "singularity"):
        answer = subprocess.run([name, "--version"], capture_output=True, text=True)
        assert (answer.returncode, answer.stdout) == (0, "apptainer version 1.4.5\n"), name
    # It runs a container: the SIF's own runscript is not needed for that.
    probe = subprocess.run(["apptainer", "exec", "--help"], capture_output=True, text=True)
    assert probe.returncode == 0


def test_the_sif_is_built_from_our_recipe_for_the_cpu_image_and_cached_by_its_digest(sif):
    image_id = subprocess.run(
        ["docker", "image", "inspect", "--format", "{{.Id}}", IMAGE], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert sif.name == f"reprocube-{IMAGE.split(':')[1]}-{image_id.removeprefix('sha256:')[:12]}.sif"
    inspected = subprocess.run(["apptainer", "inspect", "--json", str(sif)], capture_output=True, text=True, check=True)
    labels = json.loads(inspected.stdout)["data"]["attributes"]["labels"]
    assert labels["org.reprocube.docker-image-id"] == image_id
    assert labels["org.reprocube.variant"] == "cpu"
    assert labels["org.label-schema.usage.singularity.deffile.from"] == IMAGE  # {{ VARIANT }} filled in
    assert labels["org.label-schema.usage.singularity.deffile.bootstrap"] == "docker-daemon"
    # The recipe's %test ran at build time; run it again on the finished SIF.
    tested = subprocess.run(["apptainer", "test", str(sif)], capture_output=True, text=True)
    assert tested.returncode == 0, tested.stderr
    # A second request reuses it: no build (checked against the recorded sha256 and the label).
    started = time.perf_counter()
    again = subprocess.run([str(SIF_SH), "cpu", str(sif.parent)], capture_output=True, text=True)
    assert (again.returncode, again.stdout.strip(), again.stderr) == (0, str(sif), "")
    print(f"reused in {time.perf_counter() - started:.1f} s")


@pytest.mark.parametrize("task", ["download", *FRAMEWORKS, "reproduce", "verify", "check"])
def test_every_task_succeeds_under_singularity(cube, task):
    result = cube.results[f"singularity {task}"]
    assert result.returncode == 0, f"mlcube --task={task} exited {result.returncode}:\n{result.stdout[-3000:]}"
    assert "Traceback" not in result.stdout  # apptainer's version string is understood (the launcher's patch)


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_native_docker_and_apptainer_runs_are_bit_identical(cube, framework, tmp_path):
    """Same machine, same config and thread count: the SIF (the Docker image's files) gives the weights of
    the Docker container and of this checkout's venv, at every epoch."""
    docker = cube.results[f"docker {framework} runs_dir=runs-docker"]
    assert docker.returncode == 0, docker.stdout[-3000:]
    native = subprocess.run(
        [
            sys.executable,
            "-m",
            "reprocube",
            "train",
            "--config-file",
            str(cube.workspace / "train.yaml"),
            f"framework={framework}",
            f"data_dir={cube.workspace / 'data'}",
            f"output_dir={tmp_path}",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert native.returncode == 0, native.stderr
    digests = {
        "native": final_digests(tmp_path / f"{framework}-seed0"),
        "docker": final_digests(cube.workspace / "runs-docker" / f"{framework}-seed0"),
        "apptainer": final_digests(cube.workspace / "runs" / f"{framework}-seed0"),
    }
    print(f"{framework} final weights_digest: " + ", ".join(f"{k} {v[-1][:16]}" for k, v in digests.items()))
    assert len(digests["native"]) == 2 and digests["native"] == digests["docker"] == digests["apptainer"]


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_env_json_records_the_apptainer_runtime_and_the_sif(cube, sif, framework):
    env = json.loads((cube.workspace / "runs" / f"{framework}-seed0" / "env.json").read_text())
    container = env["container"]
    recorded = (sif.parent / f"{sif.name}.sha256").read_text().split()[0]
    image_id = subprocess.run(
        ["docker", "image", "inspect", "--format", "{{.Id}}", IMAGE], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert container["runtime"] == "singularity"
    assert container["image"] == str(sif)
    assert container["sif_sha256"] == recorded  # hashed inside the container, from the bound image folder
    assert container["built_with_apptainer"] == apptainer_version()
    assert (container["docker_image"], container["docker_image_id"]) == (IMAGE, image_id)
    assert container["build"]["lock_sha256"] == hashlib.sha256((REPO / "requirements-cpu.txt").read_bytes()).hexdigest()
    assert env["env_vars"].get("PYTHONHASHSEED") == "0"


def test_a_receipt_made_in_the_sif_reproduces_bit_identically_in_the_sif_in_docker_and_natively(cube, tmp_path):
    receipt = cube.workspace / "published" / "receipt.json"
    native = subprocess.run(
        [sys.executable, "-m", "reprocube", "reproduce", str(receipt), "--out", str(tmp_path / "native")]
        + [f"data_dir={cube.workspace / 'data'}"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert native.returncode == 0, native.stderr[-3000:]
    docker = cube.results["docker reproduce report_dir=reports/reproduce-docker"]
    assert docker.returncode == 0, docker.stdout[-3000:]
    for where in ("reports/reproduce", "reports/reproduce-docker"):
        result = json.loads((cube.workspace / where / "reproduce.json").read_text())
        assert (result["verdict"], result["tier"]) == ("bit-identical", "bit-identical"), where
    result = json.loads((tmp_path / "native" / "reproduce.json").read_text())
    assert (result["verdict"], result["tier"]) == ("bit-identical", "bit-identical")
    assert result["coverage"]["compared_steps"] == result["coverage"]["a_steps"][1] > 0


def test_verify_task_proves_bit_exact_resume_inside_the_sif(cube):
    result = json.loads((cube.workspace / "runs" / "verify-pytorch" / "reference" / "verify.json").read_text())
    assert result["passed"] is True
    labels = [check["check"] for check in result["checks"]]
    assert any("stopped by SIGTERM at step" in label for label in labels), labels  # the drill ran in the SIF


def test_check_task_checks_a_script_of_ones_own_in_the_sif(cube):
    result = json.loads((cube.workspace / "check" / "check.json").read_text())
    assert result["verdict"] == "resume-exact", result["summary"]
    assert result["environment"]["container"]["runtime"] == "singularity"


# ---- failure modes: one line each ---------------------------------------------------------------------------


def sif_sh(*args: str, env_extra: dict | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, **(env_extra or {})}
    return subprocess.run([str(SIF_SH), *args], capture_output=True, text=True, env=env, timeout=120)


def test_sif_sh_refuses_a_corrupt_sif_and_one_of_another_image_in_one_line(sif, tmp_path):
    """The cache's SIF is reused only with the sha256 recorded at its build and the image id in its label."""
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    (corrupt / sif.name).write_bytes(sif.open("rb").read(1 << 20))  # a partial copy, beside the real record
    shutil.copy(sif.parent / f"{sif.name}.sha256", corrupt)
    refused = sif_sh("cpu", str(corrupt))
    assert (refused.returncode, refused.stdout, refused.stderr.splitlines()) == (
        4,
        "",
        [
            f"sif.sh: error: {corrupt / sif.name}: its sha256 is not the one recorded when it was built "
            f"({sif.name}.sha256): a corrupt or replaced image; remove it to rebuild"
        ],
    )
    # A SIF of another Docker image under this image's name, with a true record of its own sha256: a tiny
    # one built from a folder holding only its labels (under a second).
    other, sandbox = tmp_path / "other", tmp_path / "sandbox"
    (sandbox / ".singularity.d").mkdir(parents=True)
    (sandbox / ".singularity.d" / "labels.json").write_text(
        json.dumps({"org.reprocube.docker-image-id": "sha256:0ther"})
    )
    other.mkdir()
    subprocess.run(["apptainer", "build", str(other / sif.name), str(sandbox)], check=True, capture_output=True)
    subprocess.run(f"sha256sum {sif.name} > {sif.name}.sha256", shell=True, cwd=other, check=True)
    refused = sif_sh("cpu", str(other))
    image_id = subprocess.run(
        ["docker", "image", "inspect", "--format", "{{.Id}}", IMAGE], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert (refused.returncode, refused.stdout, refused.stderr.splitlines()) == (
        4,
        "",
        [
            f"sif.sh: error: {other / sif.name} holds Docker image sha256:0ther, not {IMAGE} ({image_id}): "
            "remove it to rebuild"
        ],
    )


@pytest.mark.parametrize(
    "args, env, message",
    [
        (["tpu"], {}, "variant 'tpu': expected cpu or gpu"),
        # A machine without Apptainer: docker is in /usr/bin (Debian's docker.io), singularity is not.
        (
            ["cpu"],
            {"PATH": "/usr/bin:/bin"},
            "singularity: command not found (make apptainer-setup installs Apptainer)",
        ),
        (
            ["cpu"],
            {"DOCKER_HOST": "unix:///nonexistent.sock"},
            f"Docker image {IMAGE} is not built or dockerd does not answer (make container-setup)",
        ),
    ],
)
def test_sif_sh_names_what_is_missing_in_one_line(args, env, message, tmp_path):
    refused = sif_sh(*args, str(tmp_path), env_extra=env)
    assert (refused.returncode, refused.stdout, refused.stderr.splitlines()) == (2, "", [f"sif.sh: error: {message}"])
    assert list(tmp_path.iterdir()) == []  # nothing built, nothing removed


def test_the_apptainer_wrapper_refuses_a_user_other_than_root_in_one_line():
    """The test installation enters its root file system with a mount namespace and pivot_root: root only
    (a cluster's own Apptainer is setuid or uses user namespaces; docs/mlcube.md)."""
    refused = subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "apptainer", "--version"],
        capture_output=True,
        text=True,
    )
    wrapper = Path(shutil.which("apptainer")).read_text()
    rootfs = next(line.split("=", 1)[1] for line in wrapper.splitlines() if line.startswith("ROOTFS="))
    assert refused.returncode == 255
    assert refused.stderr.splitlines() == [
        f"apptainer: error: this apptainer (scripts/apptainer-wrapper.sh) needs root: it enters {rootfs} with a "
        "mount namespace and pivot_root"
    ]


# ---- hpc/preemptible.sh with REPROCUBE_SIF (what the sbatch scripts exec) ------------------------------------

PREEMPTIBLE = REPO / "hpc" / "preemptible.sh"


def preemptible(*args: str, cwd: Path, env_extra: dict) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    return subprocess.run(
        ["bash", str(PREEMPTIBLE), *args], cwd=cwd, env={**env, **env_extra}, capture_output=True, text=True
    )


def test_preemptible_trains_inside_the_sif_bit_identical_to_native(sif, generated, tmp_path):
    """REPROCUBE_SIF: `singularity exec --nv SIF reprocube train ...` (no GPU here: --nv does nothing)."""
    args = ["train", "resume=auto", "framework=pytorch", "epochs=1", *generated.overrides(), "run_name=s"]
    done = preemptible(*args, "output_dir=inside", cwd=tmp_path, env_extra={"REPROCUBE_SIF": str(sif)})
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"singularity exec --nv {sif} reprocube train" in done.stderr
    container = json.loads((tmp_path / "inside" / "s" / "env.json").read_text())["container"]
    assert (container["runtime"], container["image"]) == ("singularity", str(sif))
    native = subprocess.run(
        [sys.executable, "-m", "reprocube", *args, "output_dir=native"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONHASHSEED": "0"},
    )
    assert native.returncode == 0, native.stderr
    assert final_digests(tmp_path / "inside" / "s") == final_digests(tmp_path / "native" / "s")


def test_preemptible_refuses_a_missing_or_broken_sif_and_a_missing_apptainer_in_one_line(sif, tmp_path):
    args = ["train", "framework=pytorch", "epochs=1"]
    missing = preemptible(*args, cwd=tmp_path, env_extra={"REPROCUBE_SIF": str(tmp_path / "absent.sif")})
    assert (missing.returncode, missing.stderr.splitlines()) == (
        2,
        [f"reprocube-slurm: REPROCUBE_SIF={tmp_path}/absent.sif: no such image"],
    )
    partial, other = tmp_path / "partial.sif", tmp_path / "other.sif"
    partial.write_bytes(sif.open("rb").read(1 << 20))  # the first MiB of a real one: its header is whole
    other.write_text("not an image\n")
    for broken, cause in ((partial, "bad superblock for squashfs"), (other, "image format not recognized")):
        refused = preemptible(*args, cwd=tmp_path, env_extra={"REPROCUBE_SIF": str(broken)})
        (line,) = refused.stderr.splitlines()
        assert refused.returncode == 2
        assert line.startswith(f"reprocube-slurm: REPROCUBE_SIF={broken}: singularity cannot start it: FATAL:")
        assert cause in line
    # A node without Apptainer: PATH without it (bash and the tools the script uses are in /usr/bin, /bin).
    no_apptainer = preemptible(*args, cwd=tmp_path, env_extra={"REPROCUBE_SIF": str(sif), "PATH": "/usr/bin:/bin"})
    assert (no_apptainer.returncode, no_apptainer.stderr.splitlines()) == (
        2,
        ["reprocube-slurm: singularity: command not found (REPROCUBE_SIF needs Apptainer or Singularity on the node)"],
    )
