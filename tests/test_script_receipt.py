"""Receipts for scripts that are not ours (issue 36): `reprocube check` writes one for the uninterrupted run
(the command, its inputs and the files it names by sha256, the outputs' digests, the probe trace, the
environment), and `reprocube reproduce RECEIPT -- CMD` runs the command again and says whether, where
(first update, tensors) and why it differs. Real example scripts, real processes."""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from pathlib import Path

import pytest

from reprocube.errors import CheckpointError, ConfigError
from reprocube.formats.script_receipt import _self_digest, read_script_receipt
from reprocube.results.script_reproduce_result import read_script_reproduce
from reprocube.training.signing import generate_key

from helpers import error_lines, reprocube

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
NUMPY = [sys.executable, str(EXAMPLES / "numpy_sgd.py"), "--epochs", "4", "--sleep", "0.1", "--save-rng"]
OUTPUTS = ["--output", "final.npz", "--output", "metrics.csv"]


@pytest.fixture(scope="module")
def numpy_receipt(tmp_path_factory) -> Path:
    """A check of the NumPy example (its script named by an absolute path) and the receipt it wrote."""
    where = tmp_path_factory.mktemp("numpy")
    reprocube("check", "--out", "chk", *OUTPUTS, "--seed-env", "SEED", "--at-line", "saved", "--", *NUMPY, cwd=where)
    return where / "chk" / "receipt"


def reproduce(tmp_path: Path, receipt: Path, *args: str, command=NUMPY, out: str = "rep", env_extra=None):
    proc = reprocube(
        "reproduce", str(receipt), "--out", out, *args, "--", *command, cwd=tmp_path, check=False, env_extra=env_extra
    )
    path = tmp_path / out / "script-reproduce.json"
    return proc, json.loads(path.read_text()) if path.exists() else {}


@pytest.mark.process
def test_the_receipt_records_the_command_its_source_outputs_and_trace(numpy_receipt):
    receipt = read_script_receipt(numpy_receipt)
    assert receipt.command == NUMPY
    script = hashlib.sha256((EXAMPLES / "numpy_sgd.py").read_bytes()).hexdigest()
    assert receipt.command_files == {1: script}  # the script named by its path; the interpreter is not a source
    assert set(receipt.outputs) == {"final.npz", "metrics.csv"} and receipt.seed == {"variable": "SEED", "value": "0"}
    assert receipt.trace == hashlib.sha256(receipt.trace_path.read_bytes()).hexdigest()
    assert receipt.env["cpu"]["isa"] and receipt.seconds > 0


@pytest.mark.process
def test_a_receipt_reproduces_here_bit_for_bit(numpy_receipt, tmp_path):
    proc, result = reproduce(tmp_path, numpy_receipt, env_extra={"SEED": "0"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert result["verdict"] == "bit-identical" and result["not_checked"] == []
    assert (
        result["trace"]["compared_steps"] == result["trace"]["a_steps"] == 64 and not result["trace"]["missing_steps"]
    )
    assert result["outputs"]["compared"] == ["final.npz", "metrics.csv"] and result["outputs"]["differ"] == []
    assert "everything A's receipt records reproduced (64 updates of 64, 2 outputs)" in proc.stdout
    read = read_script_reproduce(tmp_path / "rep" / "script-reproduce.json")  # the strict reader agrees
    assert read["verdict"] == "bit-identical" and read["receipt_sha256"] == result["receipt_sha256"]


@pytest.mark.process
def test_an_edited_script_differs_at_its_first_update_and_the_source_is_named(numpy_receipt, tmp_path):
    edited = tmp_path / "numpy_sgd.py"
    edited.write_text((EXAMPLES / "numpy_sgd.py").read_text().replace("np.float32(0.5)", "np.float32(0.5000001)"))
    proc, result = reproduce(tmp_path, numpy_receipt, command=[*NUMPY[:1], str(edited), *NUMPY[2:]])
    assert proc.returncode == 6, proc.stdout + proc.stderr
    first = result["trace"]["first_difference"]
    assert result["verdict"] == "differs" and first["step"] == 1 and first["tensors"] == ["w"]
    assert not result["command"]["same"] and result["inputs"]["differ"] == ["argument 1"]
    # The likeliest causes first: the command, the script's sha256, then the seed variable A's run had.
    assert [c["key"] for c in result["causes"][:3]] == ["command", "input argument 1", "seed variable SEED"]


@pytest.mark.process
def test_match_restores_a_pytorch_receipt_made_under_other_isa_caps(tmp_path):
    """A made under oneDNN, ATen and MKL ISA caps (another machine, emulated): B here differs at the first
    update, the caps are named as causes, and --match, setting them, reproduces A bit for bit."""
    caps = {"ONEDNN_MAX_CPU_ISA": "SSE41", "ATEN_CPU_CAPABILITY": "default", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2"}
    shutil.copy(EXAMPLES / "pytorch_mlp.py", tmp_path / "pytorch_mlp.py")
    command = [sys.executable, "pytorch_mlp.py", "--save-rng", "--epochs", "2"]
    reprocube(
        "check",
        "--out",
        "chk",
        "--copy",
        "pytorch_mlp.py",
        "--output",
        "model.pt",
        "--at-line",
        "saved",
        "--stops",
        "1",
        "--",
        *command,
        cwd=tmp_path,
        env_extra=caps,
    )
    proc, result = reproduce(
        tmp_path, tmp_path / "chk" / "receipt", "--match", "--copy", "pytorch_mlp.py", command=command
    )
    assert proc.returncode == 6, proc.stdout + proc.stderr
    assert result["trace"]["first_difference"]["step"] == 1 and result["inputs"]["differ"] == []
    assert {c["key"] for c in result["causes"]} >= {f"env.env_vars.{name}" for name in caps}
    assert result["match"]["bit_identical"] is True and result["match"]["settings"] == caps, result["match"]


@pytest.mark.process
def test_a_damaged_receipt_or_trace_is_one_line_and_exit_4(numpy_receipt, tmp_path):
    value = json.loads((numpy_receipt / "receipt.json").read_text())
    cases = {
        "edited": ({**value, "command": ["python", "other.py"]}, "was modified"),
        "unknown key": ({**value, "extra": 1}, "'extra' is not a key of a script receipt"),
        "path outside": ({**value, "outputs": {"../x": "0" * 64}}, "is not a path inside a work directory"),
        "seed": (
            {**value, "seed": {"variable": "LD_PRELOAD=x", "value": "0"}},
            "seed.variable 'LD_PRELOAD=x' is not a variable name",
        ),
    }
    for name, (changed, message) in cases.items():
        damaged = tmp_path / name.replace(" ", "-")
        shutil.copytree(numpy_receipt, damaged)
        if name != "edited":
            changed["receipt_sha256"] = _self_digest(changed)  # a careful forger's consistent edit
        (damaged / "receipt.json").write_text(json.dumps(changed))
        with pytest.raises(CheckpointError, match=message):
            read_script_receipt(damaged)
    traced = tmp_path / "trace-changed"
    shutil.copytree(numpy_receipt, traced)
    with open(traced / "trace.jsonl", "a") as stream:
        stream.write("\n")
    proc, _ = reproduce(tmp_path, traced, out="t")
    assert proc.returncode == 4 and "its sha256 is not the one its receipt records" in error_lines(proc)[-1]
    assert not (tmp_path / "t").exists()  # refused before anything was written


@pytest.mark.process
def test_a_script_receipt_refuses_a_run_receipts_options(numpy_receipt, tmp_path):
    proc, _ = reproduce(tmp_path, numpy_receipt, "--seeds", "2")
    assert proc.returncode == 2 and "--seeds is for a run's receipt" in error_lines(proc)[-1]


@pytest.mark.process
def test_a_signed_script_receipt_is_verified_before_anything_runs(numpy_receipt, tmp_path):
    signed = tmp_path / "signed"
    shutil.copytree(numpy_receipt, signed)
    reprocube("sign", str(signed / "receipt.json"), "--key", str(tmp_path / "a.pem"), "--new-key", cwd=tmp_path)
    generate_key(tmp_path / "other.pem")  # another key pair
    proc, _ = reproduce(tmp_path, signed, "--public-key", str(tmp_path / "other.pem.pub"), out="wrong")
    assert proc.returncode == 4 and "not by the given key" in error_lines(proc)[-1]
    assert not (tmp_path / "wrong").exists()
    proc, result = reproduce(tmp_path, signed, "--public-key", str(tmp_path / "a.pem.pub"), env_extra={"SEED": "0"})
    assert proc.returncode == 0 and result["verdict"] == "bit-identical", proc.stdout + proc.stderr


# --- what an adversarial review found (each was a false verdict, a hang, a traceback or a forged line) ---
TINY = """import os
import numpy as np
from reprocube import probe

w = np.zeros(4, np.float32)
for i in range(int(os.environ.get("N", "4"))):
    w = w + 1
    probe.step(np.float32(i), {"w": w})
os.makedirs("od", exist_ok=True)
open("od/a.bin", "wb").write(b"a")
if os.environ.get("MORE"):
    open("od/b.bin", "wb").write(b"b")
if os.environ.get("FIFO"):
    os.mkfifo("out.bin")
else:
    open("data.bin", "wb").write(os.environ.get("DATA", "x").encode())
    if os.environ.get("LINK"):
        os.symlink("data.bin", "out.bin")
    else:
        open("out.bin", "wb").write(b"x")
print("saved", flush=True)
"""
TINY_COMMAND = [sys.executable, "tiny.py"]


def tiny_receipt(where: Path, **env: str) -> Path:
    where.mkdir(parents=True, exist_ok=True)
    (where / "tiny.py").write_text(TINY)
    reprocube(
        "check",
        "--out",
        "chk",
        "--copy",
        "tiny.py",
        "--output",
        "out.bin",
        "--output",
        "od",
        "--at-line",
        "saved",
        "--stops",
        "1",
        "--",
        *TINY_COMMAND,
        cwd=where,
        check=False,
        env_extra=env,
    )
    return where / "chk" / "receipt"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return tiny_receipt(tmp_path_factory.mktemp("tiny"))


def tiny_reproduce(tmp_path: Path, receipt: Path, out: str, **env: str):
    (tmp_path / "tiny.py").write_text(TINY)  # the bytes A's check copied
    return reproduce(tmp_path, receipt, "--copy", "tiny.py", command=TINY_COMMAND, out=out, env_extra=env)


@pytest.mark.process
def test_more_updates_other_inputs_or_an_extra_output_are_differences(tiny, tmp_path):
    proc, result = tiny_reproduce(tmp_path, tiny, "same")
    assert proc.returncode == 0 and result["verdict"] == "bit-identical", proc.stdout + proc.stderr
    proc, result = tiny_reproduce(tmp_path, tiny, "more-updates", N="6")
    assert proc.returncode == 6 and "B made 6 updates, A 4" in result["summary"], result["summary"]
    proc, result = tiny_reproduce(tmp_path, tiny, "extra-output", MORE="1")
    assert proc.returncode == 6 and result["outputs"]["extra"] == ["od/b.bin"], result["summary"]
    (tmp_path / "tiny.py").write_text(TINY + "# another source, the same bits\n")
    proc = reprocube(
        "reproduce",
        str(tiny),
        "--out",
        "other-source",
        "--copy",
        "tiny.py",
        "--",
        *TINY_COMMAND,
        cwd=tmp_path,
        check=False,
    )
    result = json.loads((tmp_path / "other-source" / "script-reproduce.json").read_text())
    assert proc.returncode == 6 and "B's inputs are not A's (tiny.py)" in result["summary"], result["summary"]


@pytest.mark.process
def test_a_linked_or_special_output_is_not_checked_and_never_hangs(tmp_path):
    linked = tiny_receipt(tmp_path / "a", LINK="1")
    assert read_script_receipt(linked).unrecorded_outputs == ["out.bin"]
    proc, result = tiny_reproduce(tmp_path, linked, "linked", LINK="1", DATA="other bytes")
    assert proc.returncode == 9 and result["verdict"] == "partly-checked", proc.stdout + proc.stderr
    assert result["outputs"]["not_compared"] == ["out.bin"] and "out.bin: a link" in result["not_checked"][0]
    # A wrote a regular file there, B a FIFO: another kind of output, a difference (never a hang)
    proc, result = tiny_reproduce(tmp_path, tiny_receipt(tmp_path / "b"), "fifo", FIFO="1")
    assert proc.returncode == 6 and result["outputs"]["other_kind"] == {
        "out.bin": {"a": "a regular file or an Orbax checkpoint", "b": "a FIFO"}
    }, proc.stdout + proc.stderr


def test_a_metadata_file_that_is_not_orbax_s_is_digested_file_by_file_never_a_traceback(tmp_path):
    """A declared output directory holding a `_METADATA` of the script's own: output_digests called Orbax
    on it and check ended in a KeyError traceback. Now such a directory is walked file by file, and one
    that looks like Orbax's but that Orbax cannot read is recorded file by file, with one line of why."""
    from reprocube.analysis.outputs import collect
    from reprocube.formats.script_receipt import output_digests

    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "_METADATA").write_text('{"format": "samples-v1"}')
    (tmp_path / "results" / "samples.npy").write_bytes(b"samples")
    digests = output_digests(collect(tmp_path, ["results"], []))
    assert sorted(digests) == ["results/_METADATA", "results/samples.npy"]
    assert digests["results/samples.npy"] == hashlib.sha256(b"samples").hexdigest()
    pytest.importorskip("orbax.checkpoint")
    (tmp_path / "results" / "_METADATA").write_text('{"tree_metadata": 5}')  # Orbax's key, not Orbax's value
    notes: list[str] = []
    digests = output_digests(collect(tmp_path, ["results"], []), notes)
    assert sorted(digests) == ["results/_METADATA", "results/samples.npy"]
    [note] = notes
    assert note.startswith("results: could not be read as an Orbax checkpoint (") and "recorded one by one" in note


@pytest.mark.process
def test_forged_positions_environments_and_names_are_refused_or_shown_escaped(tiny, tmp_path):
    value = json.loads((tiny / "receipt.json").read_text())
    for name, change, message in (
        ("position", {"command_files": {"\u00b2": "0" * 64}}, "keyed by positions in command"),
        ("env", {"env": {"env_vars": {"OMP_NUM_THREADS": ["1"]}}}, "OMP_NUM_THREADS must be a string"),
    ):
        forged = {**value, **change}
        forged["receipt_sha256"] = _self_digest(forged)
        (tmp_path / name).mkdir()
        (tmp_path / name / "receipt.json").write_text(json.dumps(forged))
        with pytest.raises(CheckpointError, match=message):
            read_script_receipt(tmp_path / name)
    # A name with control characters and a forged line reaches script-reproduce.md escaped, on one line.
    forged = {**value, "outputs": {**value["outputs"], "\x1b[2J\u202eevil\nverdict: bit-identical": "0" * 64}}
    forged["receipt_sha256"] = _self_digest(forged)
    shutil.copytree(tiny, tmp_path / "named")
    (tmp_path / "named" / "receipt.json").write_text(json.dumps(forged))
    proc, _ = tiny_reproduce(tmp_path, tmp_path / "named", "escaped")
    text = (tmp_path / "escaped" / "script-reproduce.md").read_text()
    assert "\x1b" not in text and "\u202e" not in text and "\nverdict: bit-identical" not in text
    assert "\x1b" not in proc.stdout and proc.returncode == 6


@pytest.mark.process
def test_a_malformed_trace_of_b_is_not_checked_and_the_result_is_written(tiny, tmp_path):
    (tmp_path / "tiny.py").write_text(TINY)
    command = ["sh", "-c", f'{sys.executable} tiny.py; echo junk >> "$REPROCUBE_PROBE"']
    proc, result = reproduce(tmp_path, tiny, "--copy", "tiny.py", command=command, out="junk")
    assert result["trace"]["unreadable"].startswith("B's probe trace could not be read"), proc.stdout + proc.stderr
    assert any(line.startswith("every update: B's probe trace") for line in result["not_checked"])


@pytest.mark.process
def test_the_wrong_kind_of_receipt_and_a_used_out_are_usage_errors(tiny, tmp_path):
    trainer = Path(__file__).parent / "receipts" / "avx512" / "pytorch" / "receipt.json"
    proc, _ = reproduce(tmp_path, trainer, out="t")
    assert proc.returncode == 2 and "a run's receipt, reproduced without -- CMD" in error_lines(proc)[-1]
    proc = reprocube("compare", str(tiny), str(tiny), cwd=tmp_path, check=False)
    assert proc.returncode == 2 and "a script's receipt" in error_lines(proc)[-1]
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "compare.json").write_text("mine")
    (tmp_path / "link").symlink_to(tmp_path / "mine")
    for out in ("mine", "link"):
        proc = reprocube("compare", str(trainer), str(trainer), "--out", out, cwd=tmp_path, check=False)
        assert proc.returncode == 2 and len(error_lines(proc)) == 1, proc.stderr
    assert (tmp_path / "mine" / "compare.json").read_text() == "mine"


def test_a_large_file_or_a_proc_path_in_the_command_is_not_hashed(tmp_path, monkeypatch):
    """A dataset passed by its absolute path is data, not the command's source: hashing /proc/self/pagemap
    never ended (an adversary's F25), and a 150 GB archive would be read whole."""
    import reprocube.formats.script_receipt as script_receipt

    source, data = tmp_path / "train.py", tmp_path / "data.bin"
    source.write_text("print(1)\n")
    data.write_bytes(b"\0" * 1024)
    monkeypatch.setattr(script_receipt, "MAX_SOURCE_BYTES", 512)
    digests = script_receipt.command_file_digests(["python", str(source), str(data), "/proc/self/pagemap"])
    assert list(digests) == [1]  # only the script, by its position in argv


# --- the seed variable: a name only the script reads (script_receipt.refused_seed_variable) ---
READ_BY_OTHERS = (
    "PYTHONINSPECT",  # the advice "run as PYTHONINSPECT=1 ..." left the next Python at a prompt
    "PYTHONSTARTUP",
    "pythonpath",
    "LD_PRELOAD",
    "LD_LIBRARY_PATH",
    "GLIBC_TUNABLES",
    "MALLOC_PERTURB_",
    "BASH_ENV",
    "ENV",
    "PATH",
    "HOME",
    "IFS",
    "PS4",
    "SHELLOPTS",
    "TMPDIR",
    "LANG",
    "LC_ALL",
    "OMP_NUM_THREADS",
    "MKL_CBWR",
    "REPROCUBE_JAX_CACHE",
)


def test_the_seed_variable_rule():
    from reprocube.formats.script_receipt import refused_seed_variable

    for name in ("SEED", "RANDOM_SEED", "seed_2", "_SEED"):
        assert refused_seed_variable(name) is None, name
    for name in READ_BY_OTHERS:
        assert "reads it" in refused_seed_variable(name), name
    # No list of what programs read is whole (OPENSSL_CONF=0 loads ./0; APPTAINERENV_BASH_ENV reaches a
    # container's shell): a seed variable's name holds SEED.
    for name in ("OPENSSL_CONF_SEEDLESS", "APPTAINERENV_PYTHONHASHSEED", "SINGULARITYENV_SEED"):
        assert "reads it" in refused_seed_variable(name), name
    for name in ("QT_PLUGIN_PATH", "HDF5_PLUGIN_PATH", "TRITON_CACHE_DIR", "_S"):
        assert "holds SEED" in refused_seed_variable(name), name
    for name in ("1SEED", "A=B", "A B", "S" * 65, ""):
        assert refused_seed_variable(name).startswith("is not a variable name"), name


def _seeded_receipt(where: Path, variable: str) -> Path:
    """A script receipt whose seed variable is `variable`, as a forger writes it (self-digest recomputed)."""
    from reprocube.formats.script_receipt import write_script_receipt

    path = write_script_receipt(where, TINY_COMMAND, {}, [], {}, None, 1.0, {}, {"variable": "SEED", "value": "1"})
    value = json.loads(path.read_text())
    value["seed"]["variable"] = variable
    value["receipt_sha256"] = _self_digest(value)
    path.write_text(json.dumps(value))
    return where


@pytest.mark.parametrize("variable", READ_BY_OTHERS)
def test_a_receipt_whose_seed_variable_others_read_is_refused_when_read(tmp_path, variable):
    receipt = _seeded_receipt(tmp_path / "forged", variable)
    with pytest.raises(CheckpointError) as exc:
        read_script_receipt(receipt)
    message = str(exc.value)
    assert message.startswith(f"{receipt / 'receipt.json'}: seed.variable {variable!r} is refused: ")
    assert "reads it" in message and "\n" not in message


@pytest.mark.process
def test_reproduce_and_check_refuse_such_a_seed_variable_before_anything_runs(tmp_path):
    receipt = _seeded_receipt(tmp_path / "forged", "PYTHONINSPECT")
    proc, _ = reproduce(tmp_path, receipt, out="rep", command=[sys.executable, "-c", "open('ran', 'w')"])
    [line] = error_lines(proc)
    assert proc.returncode == 4 and "seed.variable 'PYTHONINSPECT' is refused: the Python interpreter" in line
    assert "run as PYTHONINSPECT" not in proc.stdout and not (tmp_path / "rep").exists()
    for variable in ("PYTHONINSPECT", "LD_PRELOAD", "HOME"):
        proc = reprocube(
            "check",
            "--out",
            "chk",
            "--output",
            "x",
            "--seed-env",
            variable,
            "--",
            sys.executable,
            "-c",
            "pass",
            cwd=tmp_path,
            check=False,
        )
        [line] = error_lines(proc)
        assert proc.returncode == 2 and f"--seed-env '{variable}' is refused: " in line, proc.stderr
    assert not (tmp_path / "chk").exists() and not (tmp_path / "ran").exists()
    from reprocube.formats.script_receipt import write_script_receipt

    with pytest.raises(ConfigError, match="seed variable 'BASH_ENV' is refused: a shell reads it"):
        write_script_receipt(tmp_path / "w", ["x"], {}, [], {}, None, 1.0, {}, {"variable": "BASH_ENV", "value": "1"})
    assert not (tmp_path / "w").exists()


# --- outputs B has as another kind than A had: a difference in the verdict, never a reader's error ---
ORBAX = """import os
from pathlib import Path
import numpy as np
from reprocube import probe

w = np.zeros(4, np.float32)
for i in range(3):
    w = w + 1
    probe.step(np.float32(i), {"w": w})
kind = os.environ.get("KIND", "orbax")
if kind == "orbax" and not Path("final").exists():
    import orbax.checkpoint as ocp

    saver = ocp.StandardCheckpointer()
    saver.save(Path("final").absolute(), {"w": w})
    saver.wait_until_finished()
elif kind == "directory":  # a plain directory where A had an Orbax checkpoint
    os.makedirs("final/sub")
    open("final/sub/w.bin", "wb").write(w.tobytes())
elif kind == "unreadable":  # Orbax's marker, nothing Orbax can read
    os.makedirs("final")
    open("final/_METADATA", "w").write('{"tree_metadata": {}}')
elif kind == "file":
    open("final", "wb").write(w.tobytes())
print("saved", flush=True)
"""


@pytest.fixture(scope="module")
def orbax_receipt(tmp_path_factory) -> Path:
    """A check of a script whose one declared output, final, is an Orbax checkpoint."""
    pytest.importorskip("orbax.checkpoint")
    where = tmp_path_factory.mktemp("orbax")
    (where / "orbax_out.py").write_text(ORBAX)
    reprocube(
        "check", "--out", "chk", "--copy", "orbax_out.py", "--output", "final", "--at-line", "saved", "--stops", "1",
        "--", sys.executable, "orbax_out.py", cwd=where, check=False,
    )  # fmt: skip
    assert list(read_script_receipt(where / "chk" / "receipt").outputs) == ["final"]
    return where / "chk" / "receipt"


@pytest.mark.process
@pytest.mark.parametrize(
    "kind, summary",
    [
        ("directory", "final is a directory in B, where A had a regular file or an Orbax checkpoint"),
        ("unreadable", "final is a directory that Orbax cannot read ("),
        ("file", "final differs"),
        ("none", "B did not write final"),
    ],
)
def test_an_output_b_has_as_another_kind_is_a_difference_with_a_result(orbax_receipt, tmp_path, kind, summary):
    """A script receipt whose outputs name an Orbax checkpoint, and a B that wrote a plain directory there
    (reproduce ended in Orbax's own error before b34860b, then in "B did not write final" and its files as
    B's extra outputs), one Orbax cannot read, a file, or nothing: each is a difference in the verdict that
    says what B has, exit 6, with script-reproduce.json and .md written."""
    (tmp_path / "orbax_out.py").write_text(ORBAX)
    proc, result = reproduce(
        tmp_path,
        orbax_receipt,
        "--copy",
        "orbax_out.py",
        command=[sys.executable, "orbax_out.py"],
        env_extra={"KIND": kind},
    )
    assert proc.returncode == 6 and "Traceback" not in proc.stderr, proc.stdout + proc.stderr
    assert result["verdict"] == "differs" and summary in result["summary"], result["summary"]
    assert (tmp_path / "rep" / "script-reproduce.md").exists() and not error_lines(proc)
    if kind in ("directory", "unreadable"):
        assert list(result["outputs"]["other_kind"]) == ["final"] and result["outputs"]["missing"] == []
        assert result["outputs"]["extra"] == []  # its files are not outputs of their own
        assert "another kind in B: `final` is a directory" in (tmp_path / "rep" / "script-reproduce.md").read_text()


def test_each_kind_of_output_a_and_b_can_have(tmp_path, monkeypatch):
    """What each run had at a name A's receipt lists, against each other (script_reproduction._outputs);
    more outputs than a receipt may list is a difference too (it was a CheckpointError: exit 4, no result)."""
    import os

    import reprocube.formats.script_receipt as script_receipt
    from reprocube.check.reproduction import _outputs
    from reprocube.formats.script_receipt import write_script_receipt

    names = ["file", "to-link", "gone", "link-to-file", "link-both", "fifo-gone", "same"]
    digest = hashlib.sha256(b"same").hexdigest()
    outputs = {"file": "1" * 64, "to-link": "2" * 64, "gone": "3" * 64, "same": digest}
    unrecorded = {"link-to-file": None, "link-both": None, "fifo-gone": None}
    receipt = read_script_receipt(
        write_script_receipt(tmp_path / "a", ["x"], {}, names, {**outputs, **unrecorded}, None, 1.0, {}, None)
    )
    work = tmp_path / "b"
    (work / "file").mkdir(parents=True)
    (work / "file" / "inside.bin").write_bytes(b"x")
    (work / "to-link").symlink_to("same")
    (work / "link-to-file").write_bytes(b"a file where A had a link")
    (work / "link-both").symlink_to("same")
    (work / "same").write_bytes(b"same")
    os.mkfifo(work / "extra.fifo")  # under no declared output: not B's output
    found = _outputs(receipt, work)
    assert found == {
        "compared": ["same"],
        "differ": [],
        "missing": ["fifo-gone", "gone"],
        "extra": [],
        "not_compared": ["link-both"],
        "other_kind": {
            "file": {"a": "a regular file or an Orbax checkpoint", "b": "a directory"},
            "link-to-file": {"a": "a link or a special file (not recorded)", "b": "a regular file"},
            "to-link": {"a": "a regular file or an Orbax checkpoint", "b": "a symbolic link"},
        },
    }
    monkeypatch.setattr(script_receipt, "MAX_FILES", 3)
    many = tmp_path / "many"
    (many / "out").mkdir(parents=True)
    for n in range(5):
        (many / "out" / f"{n}.bin").write_bytes(b"")
    receipt = read_script_receipt(
        write_script_receipt(tmp_path / "a2", ["x"], {}, ["out"], {"out/0.bin": "1" * 64}, None, 1.0, {}, None)
    )
    found = _outputs(receipt, many)
    assert found["too_many"] == 3 and found["compared"] == found["missing"] == [], found
