"""End to end through Docker: the CPU image (scripts/container-setup.sh builds it) run by the real mlcube
0.0.9 CLI, as a non-root user, on real Fashion-MNIST (a subset). .ci/run sets REPROCUBE_CONTAINER_TESTS=1,
which turns a missing Docker or image from a skip into a failure."""

from __future__ import annotations

import hashlib
import ipaddress
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from reprocube.training.backend import FRAMEWORKS
from reprocube.training.checkpoint import list_checkpoints, read_checkpoint

from helpers import reprocube, wait_until

pytestmark = pytest.mark.process  # every test here starts a process: not in make test-quick

REPO = Path(__file__).resolve().parents[1]
MLCUBE = REPO / ".venv-mlcube" / "bin" / "mlcube"
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
IMAGE = f"reprocube/reprocube:{VERSION}-cpu"
FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")
# The README's CPU command line: the CPU image, no GPU arguments.
CPU = [f"-Pdocker.image={IMAGE}", "-Pplatform.accelerator_count=0", "-Pdocker.build_args.VARIANT=cpu"]
TRAIN = {
    "dataset": "fashion_mnist",
    "seed": 0,
    "epochs": 2,
    "threads": 2,
    "data": {"train_limit": 640, "test_limit": 320},
}


def _not_ready() -> str | None:
    if shutil.which("docker") is None:
        return "docker is not installed"
    if subprocess.run(["docker", "info"], capture_output=True).returncode != 0:
        return "dockerd is not reachable"
    if subprocess.run(["docker", "image", "inspect", IMAGE], capture_output=True).returncode != 0:
        return f"image {IMAGE} is not built"
    if not FASHION_MNIST.is_dir():
        return f"{FASHION_MNIST} is missing (Debian package dataset-fashion-mnist)"
    if not MLCUBE.exists():
        return f"{MLCUBE} is missing (make setup)"
    return None


@pytest.fixture(scope="module", autouse=True)
def ready():
    reason = _not_ready()
    if reason and os.environ.get("REPROCUBE_CONTAINER_TESTS") == "1":
        pytest.fail(f"container tests required but {reason}; run scripts/container-setup.sh")
    if reason:
        pytest.skip(f"{reason}: scripts/container-setup.sh prepares them (.ci/run does)")


class Cube:
    """A workspace driven by `mlcube run` as one user. Under root (as in CI) that user is uid 4242, so that
    'the files belong to the invoking user' cannot pass by accident as root."""

    def __init__(self, root: Path):
        self.root = root
        self.uid, self.gid = (4242, 4242) if os.geteuid() == 0 else (os.getuid(), os.getgid())
        self.workspace = root / "workspace"
        self.home = root / "home"
        for directory in (self.workspace, self.home, self.workspace / "source"):
            directory.mkdir(parents=True, exist_ok=True)
        for archive in FASHION_MNIST.glob("*.gz"):
            shutil.copy(archive, self.workspace / "source" / archive.name)
        self.write("train.yaml", TRAIN)
        self.write("verify.yaml", {"framework": "all", "verify": {"mid_epoch": True}})
        self.write("study.yaml", {"framework": "pytorch", "study": {"runs": 2}})
        self.mlcube = MLCUBE
        if os.geteuid() == 0:
            # This user cannot reach a Python under /root (pyenv): its own launcher venv on Debian's python3.
            launcher = root / "launcher"
            uv = Path(sys.executable).parent / "uv"
            subprocess.run([str(uv), "venv", "--quiet", "--python", "/usr/bin/python3", str(launcher)], check=True)
            subprocess.run(
                [
                    str(uv),
                    "pip",
                    "install",
                    "--quiet",
                    "--python",
                    str(launcher / "bin" / "python"),
                    "--require-hashes",
                    "-r",
                    str(REPO / "requirements-mlcube.txt"),
                ],
                check=True,
            )
            # What `make setup` does: docker runs without a shell (scripts/reprocube_mlcube_noshell.py).
            subprocess.run(
                [str(launcher / "bin" / "python"), str(REPO / "scripts" / "reprocube_mlcube_noshell.py"), "--install"],
                check=True,
            )
            self.mlcube = launcher / "bin" / "mlcube"
            for path in [root, *root.rglob("*")]:
                os.chown(path, self.uid, self.gid, follow_symlinks=False)
        self.results: dict[str, subprocess.CompletedProcess] = {}

    def write(self, name: str, content: dict) -> None:
        path = self.workspace / name
        path.write_text(yaml.safe_dump(content))
        if os.geteuid() == 0:
            os.chown(path, self.uid, self.gid)

    def add_script(self, script: Path, options: dict) -> None:
        directory = self.workspace / "script"
        directory.mkdir()
        shutil.copy(script, directory / script.name)
        (directory / "check.yaml").write_text(yaml.safe_dump(options))
        if os.geteuid() == 0:
            for path in (directory, *directory.iterdir()):
                os.chown(path, self.uid, self.gid)

    def popen(self, task: str, *params: str) -> subprocess.Popen:
        command = [
            str(self.mlcube),
            "run",
            f"--mlcube={REPO}",
            "--platform=docker",
            f"--task={task}",
            f"--workspace={self.workspace}",
            *params,
            "--",
            *CPU,
        ]
        as_user = {}
        if os.geteuid() == 0:  # the docker socket's group, as a user in the docker group would have it
            as_user = {"user": self.uid, "group": self.gid, "extra_groups": [os.stat("/var/run/docker.sock").st_gid]}
        env = {"PATH": os.environ["PATH"], "HOME": str(self.home), "LANG": "C.UTF-8"}
        return subprocess.Popen(
            command, cwd=self.root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **as_user
        )

    def run(self, task: str, *params: str, timeout: float = 900) -> subprocess.CompletedProcess:
        started = time.perf_counter()
        process = self.popen(task, *params)
        output, _ = process.communicate(timeout=timeout)
        print(
            f"mlcube --task={task} {' '.join(params)}: "
            f"exit {process.returncode} in {time.perf_counter() - started:.1f} s"
        )
        result = subprocess.CompletedProcess(process.args, process.returncode, output, "")
        self.results[" ".join((task, *params))] = result
        return result


CHECK_YAML = {
    "command": ["python", "numpy_sgd.py", "--epochs", "4", "--sleep", "0.1", "--save-rng"],
    "output": ["final.npz", "metrics.csv"],
    "seed_env": "SEED",
    "at_line": "saved",
}


def final_digests(run: Path) -> list[str]:
    return [read_checkpoint(path).manifest.weights_digest for path in list_checkpoints(run / "checkpoints")]


@pytest.fixture(scope="module")
def cube():
    root = Path(tempfile.mkdtemp(prefix="reprocube-cube-"))
    root.chmod(0o755)
    cube = Cube(root)
    for task in ("download", *FRAMEWORKS, "reproduce", "verify", "report", "compare", "study", "check"):
        if task == "reproduce":  # publish the pytorch task's receipt, as another machine would receive it
            published = cube.workspace / "published"
            published.mkdir()
            shutil.copy(cube.workspace / "runs" / "pytorch-seed0" / "receipt.json", published)
            if os.geteuid() == 0:
                for path in (published, published / "receipt.json"):
                    os.chown(path, cube.uid, cube.gid)
        if task == "check":  # a researcher's own script and its check.yaml in workspace/script
            cube.add_script(REPO / "examples" / "numpy_sgd.py", CHECK_YAML)
        cube.run(task)
    yield cube
    shutil.rmtree(root, ignore_errors=True)


@pytest.mark.parametrize(
    "task", ["download", *FRAMEWORKS, "reproduce", "verify", "report", "compare", "study", "check"]
)
def test_every_task_succeeds(cube, task):
    result = cube.results[task]
    assert result.returncode == 0, f"mlcube --task={task} exited {result.returncode}:\n{result.stdout[-3000:]}"


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_training_tasks_write_verified_runs_into_the_workspace(cube, framework):
    run = cube.workspace / "runs" / f"{framework}-seed0"
    assert [p.name for p in list_checkpoints(run / "checkpoints")] == ["epoch-0001", "epoch-0002"]
    assert all(len(digest) == 64 for digest in final_digests(run))  # read_checkpoint verified every file
    env = json.loads((run / "env.json").read_text())
    container = env["container"]
    assert (container["runtime"], container["image"]) == ("docker", IMAGE)
    # The image records the lock it was installed from: this checkout's.
    assert container["build"]["lock"] == "requirements-cpu.txt"
    assert container["build"]["lock_sha256"] == hashlib.sha256((REPO / "requirements-cpu.txt").read_bytes()).hexdigest()
    assert env["env_vars"].get("PYTHONHASHSEED") == "0"


def test_verify_task_passes_for_all_three_frameworks(cube):
    for framework in FRAMEWORKS:
        result = json.loads((cube.workspace / "runs" / f"verify-{framework}" / "reference" / "verify.json").read_text())
        assert result["passed"] is True, framework
        labels = [check["check"] for check in result["checks"]]
        assert any("stopped by SIGTERM at step" in label for label in labels), labels  # the drill ran in the container
    assert "verdict: all bit-identical" in cube.results["verify"].stdout


def test_report_and_compare_tasks_write_their_outputs(cube):
    assert (cube.workspace / "reports" / "report" / "report.html").stat().st_size > 10_000
    compared = json.loads((cube.workspace / "reports" / "compare" / "compare.json").read_text())
    assert compared["identical"] is True  # the pytorch task's run and verify's reference: same config, same bits


def test_reproduce_task_reproduces_the_published_receipt_in_the_container(cube):
    result = json.loads((cube.workspace / "reports" / "reproduce" / "reproduce.json").read_text())
    assert (result["verdict"], result["tier"]) == ("bit-identical", "bit-identical")
    # Each container has its own host name: listed, as not a cause; nothing else differs.
    assert [c["key"] for c in result["causes"]] in ([], ["env.hostname"])
    assert result["coverage"]["compared_steps"] == result["coverage"]["a_steps"][1] > 0
    assert (cube.workspace / "reports" / "reproduce" / "report.html").is_file()


def test_a_committed_reference_receipt_gets_the_same_answer_in_the_container_as_natively(cube, tmp_path):
    """The AVX-512 machine's PyTorch reference receipt (tests/receipts): the reproduce task in the CPU image
    and `reprocube reproduce` natively, on this machine, give the same verdict, first divergence and claim
    counts (bit-identical on an AVX-512 machine; on an AVX2 one, the same difference)."""
    source = REPO / "tests" / "receipts" / "avx512" / "pytorch" / "receipt.json"
    published = cube.workspace / "published-reference"
    published.mkdir(exist_ok=True)
    shutil.copy(source, published / "receipt.json")
    if os.geteuid() == 0:
        for path in (published, published / "receipt.json"):
            os.chown(path, cube.uid, cube.gid)
    proc = cube.run("reproduce", "receipt=published-reference/receipt.json", "report_dir=reports/reproduce-reference")
    assert proc.returncode in (0, 6, 7), proc.stdout
    inside = json.loads((cube.workspace / "reports" / "reproduce-reference" / "reproduce.json").read_text())
    native = subprocess.run(
        [
            sys.executable,
            "-m",
            "reprocube",
            "reproduce",
            str(source),
            "--match",
            "--out",
            str(tmp_path / "native"),
            f"data_dir={cube.workspace / 'data'}",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert native.returncode == proc.returncode, native.stderr
    outside = json.loads((tmp_path / "native" / "reproduce.json").read_text())
    for key in ("verdict", "tier", "first_divergence", "claims", "epoch_differences"):
        assert inside[key] == outside[key], key


def test_an_avx2_run_gets_the_same_answer_in_the_container_as_natively(cube, tmp_path):
    """A run made on QEMU's model of the AVX2 machine's CPU (reprocube.runtime.cpu_emulation), reproduced by the
    reproduce task in the CPU image (which has QEMU) and natively: the same verdict, first divergence,
    claims and --match outcome (on an AVX-512 machine: B differs, and A's bits on the emulated CPU)."""
    from reprocube.runtime.cpu_emulation import CHECKED_MODELS, emulator_path

    if emulator_path() is None:
        pytest.fail("qemu-x86_64 is not installed (make test installs it)")
    model = CHECKED_MODELS[0][0]
    config = ("framework=pytorch", "dataset=fashion_mnist", "data.train_limit=192", "data.test_limit=64", "epochs=1")
    data = f"data_dir={cube.workspace / 'data'}"
    reprocube("train", *config, data, "run_name=a", cwd=tmp_path, cpu=model, timeout=600)
    published = cube.workspace / "published-avx2"
    published.mkdir(exist_ok=True)
    shutil.copy(tmp_path / "runs" / "a" / "receipt.json", published / "receipt.json")
    if os.geteuid() == 0:
        for path in (published, published / "receipt.json"):
            os.chown(path, cube.uid, cube.gid)
    proc = cube.run("reproduce", "receipt=published-avx2/receipt.json", "report_dir=reports/reproduce-avx2")
    assert proc.returncode in (0, 6), proc.stdout
    inside = json.loads((cube.workspace / "reports" / "reproduce-avx2" / "reproduce.json").read_text())
    native = reprocube(
        "reproduce", "runs/a", "--match", "--out", "native", data, cwd=tmp_path, check=False, timeout=900
    )
    assert native.returncode == proc.returncode, native.stderr
    outside = json.loads((tmp_path / "native" / "reproduce.json").read_text())
    for key in ("verdict", "tier", "first_divergence", "claims", "epoch_differences"):
        assert inside[key] == outside[key], key
    if outside["verdict"] != "bit-identical":  # an AVX-512 machine: both emulated A's CPU, and gave its bits
        for match in (inside["match"], outside["match"]):
            assert match["bit_identical"] is True and match["cpu"] == model, match["summary"]


def test_check_task_checks_a_script_of_ones_own_in_the_image(cube):
    """mlcube run --task=check: workspace/script (a script and its check.yaml) checked inside the pinned
    image, the probe included (reprocube is importable there): every update compared, each restart matched."""
    result = json.loads((cube.workspace / "check" / "check.json").read_text())
    assert result["verdict"] == "resume-exact", result["summary"]
    assert result["environment"]["container"]["runtime"] == "docker"
    traced = result["probe"]["resume"]
    assert traced["compared_steps"] == traced["reference_steps"] == 64 and traced["first_difference"] is None
    assert [a["how"] for a in traced["attempts"]] == ["first", "matched", "matched"]
    assert (cube.workspace / "check" / "work" / "stopped" / "numpy_sgd.py").is_file()  # copied, not mounted


def test_study_task_runs_the_variance_study_in_the_container(cube):
    result = json.loads((cube.workspace / "study" / "study.json").read_text())
    same, different = result["groups"]["same_seed"], result["groups"]["different_seeds"]
    assert (same["runs"], same["distinct_weights_digests"], same["test_accuracy"]["std"]) == (2, 1, 0.0)
    assert (different["runs"], different["distinct_weights_digests"]) == (2, 2)
    # Its same-seed runs are the pytorch task's run (same train.yaml, seed 0), bit for bit.
    assert {r["weights_digest"] for r in result["runs"] if r["group"] == "same_seed"} == {
        final_digests(cube.workspace / "runs" / "pytorch-seed0")[-1]
    }
    assert (cube.workspace / "study" / "study.png").stat().st_size > 1000


def test_everything_in_the_workspace_belongs_to_the_invoking_user(cube):
    foreign = [
        str(p)
        for p in [cube.workspace, *cube.workspace.rglob("*")]
        if (p.lstat().st_uid, p.lstat().st_gid) != (cube.uid, cube.gid)
    ]
    assert foreign == []
    assert (cube.workspace / "runs" / "pytorch-seed0" / "checkpoints" / "epoch-0002").is_dir()


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_native_run_gives_the_container_runs_bits(cube, framework, tmp_path):
    """Same machine, same config and thread count: the image's Python and libraries give the same weights."""
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
    assert final_digests(tmp_path / f"{framework}-seed0") == final_digests(
        cube.workspace / "runs" / f"{framework}-seed0"
    )


def test_docker_stop_mid_epoch_checkpoints_and_the_resumed_run_is_bit_exact(cube, tmp_path):
    """A preemption as a scheduler does it: SIGTERM to the container (tini forwards it to reprocube)."""
    config = {**TRAIN, "threads": 1, "run_name": "stopped", "data": {"train_limit": 24000, "test_limit": 320}}
    cube.write("stop.yaml", config)
    process = cube.popen("pytorch", "parameters_file=stop.yaml")
    run = cube.workspace / "runs" / "stopped"
    wait_until((run / "checkpoints" / "epoch-0001").exists, timeout=300, what="the first checkpoint", process=process)
    containers = subprocess.run(
        ["docker", "ps", "-q", "--filter", f"ancestor={IMAGE}"], capture_output=True, text=True, check=True
    ).stdout.split()
    assert len(containers) == 1
    subprocess.run(["docker", "kill", "--signal=TERM", containers[0]], check=True, capture_output=True)
    output, _ = process.communicate(timeout=300)
    assert process.returncode != 0, output  # mlcube reports the task's exit status 75 as a failure
    assert "stopped by SIGTERM" in output, output[-2000:]
    stopped_at = [p.name for p in list_checkpoints(run / "checkpoints")]
    assert "epoch-0002" not in stopped_at and stopped_at[-1].startswith("step-"), stopped_at  # stopped mid-epoch 2

    cube.write("stop.yaml", {**config, "resume": "latest"})
    resumed = cube.run("pytorch", "parameters_file=stop.yaml")
    assert resumed.returncode == 0, resumed.stdout[-3000:]

    cube.write("uninterrupted.yaml", {**config, "run_name": "uninterrupted"})
    native = subprocess.run(
        [
            sys.executable,
            "-m",
            "reprocube",
            "train",
            "--config-file",
            str(cube.workspace / "uninterrupted.yaml"),
            "framework=pytorch",
            f"data_dir={cube.workspace / 'data'}",
            f"output_dir={tmp_path}",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert native.returncode == 0, native.stderr
    assert final_digests(run)[-1] == final_digests(tmp_path / "uninterrupted")[-1]


def _bridge_gateway() -> str:
    """The host's address on Docker's default bridge (docker0): the subnet's gateway, or else its first host,
    which is what dockerd assigns docker0 (20.10 reports only the subnet)."""
    inspected = subprocess.run(
        ["docker", "network", "inspect", "bridge"], capture_output=True, text=True, check=True
    ).stdout
    config = json.loads(inspected)[0]["IPAM"]["Config"][0]
    return config.get("Gateway") or str(next(ipaddress.ip_network(config["Subnet"]).hosts()))


def test_download_task_reaches_a_mirror_only_with_network_bridge(cube):
    """Containers run with --network=none; `mlcube run ... --network=bridge` lets the download task out.
    The mirror: an HTTP server on the host's docker0 address serving Debian's Fashion-MNIST."""
    gateway = _bridge_gateway()
    handler = partial(SimpleHTTPRequestHandler, directory=str(FASHION_MNIST))
    server = ThreadingHTTPServer((gateway, 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        cube.write(
            "mirror.yaml", {"dataset": {"mirrors": [f"http://{gateway}:{server.server_port}/"]}}
        )  # Fashion-MNIST is the default
        params = ("parameters_file=mirror.yaml", "source_dir=no-source", "data_dir=mirrored")
        offline = cube.run("download", *params)
        assert offline.returncode != 0
        assert any(line.startswith("reprocube: error:") for line in offline.stdout.splitlines()), offline.stdout[-2000:]
        assert list((cube.workspace / "mirrored").rglob("*-ubyte")) == []  # nothing half-written under a final name

        online = cube.run("download", "--network=bridge", *params)
        assert online.returncode == 0, [line for line in online.stdout.splitlines() if "reprocube" in line]
        assert sorted(p.name for p in (cube.workspace / "mirrored" / "fashion_mnist").iterdir()) == sorted(
            p.name.removesuffix(".gz") for p in FASHION_MNIST.glob("*.gz")
        )
    finally:
        server.shutdown()
