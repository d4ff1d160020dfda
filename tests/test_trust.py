"""Evidence from elsewhere can never run code, leak, escape, exhaust or fake a verdict (docs/security.md: "What a
receipt can do"). Each test attacks one rule, with receipts forged the way an attacker would: edit the
JSON, then recompute config_hash and receipt_sha256 with reprocube's own functions, so the receipt passes
every integrity check and only the rule under test stands in the way."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import reprocube.analysis.receipt_comparison as receipt_comparison
import reprocube.orchestration.run_reproduction as reproduce_module
from reprocube.commands.reproduce import reproduce
from reprocube.config import config_hash, load_config, override
from reprocube.errors import CheckpointError, ConfigError, ReprocubeError
from reprocube.files import json_text, safe_name
from reprocube.formats.trace import LOSS_KEYS, TRACE_VERSION, decode_losses, encode_losses
from reprocube.terminal import printable
from reprocube.training.receipt import self_digest
from reprocube.untrusted import iter_json_lines, read_json

from helpers import error_lines, reprocube, reproduce_receipt

SECRET = "s3cr3t-value-of-the-reproducer"
SMALL = ["epochs=2", "log.every_steps=5", "trace.every_steps=5"]


@pytest.fixture(scope="module")
def receipt_a(generated, tmp_path_factory) -> dict:
    """A genuine two-epoch PyTorch receipt on the generated dataset."""
    where = tmp_path_factory.mktemp("a")
    reprocube(
        "train", "framework=pytorch", *generated.overrides(), *SMALL, f"output_dir={where}", "run_name=a", cwd=where
    )
    return json.loads((where / "a" / "receipt.json").read_text())


def forge(receipt: dict, change) -> dict:
    """A copy of `receipt` changed by `change`, its hashes recomputed (as an attacker would)."""
    forged = json.loads(json.dumps(receipt))
    change(forged)
    forged["config_hash"] = config_hash(forged["config"])
    forged["receipt_sha256"] = self_digest(forged)
    return forged


def write(receipt: dict, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(receipt))
    return path


class TrainingWouldStart(Exception):
    """Raised instead of starting B: everything before training has accepted the receipt."""

    def __init__(self, command, env):
        super().__init__("training would start")
        self.command, self.env = command, env


@pytest.fixture
def until_training(monkeypatch):
    """reproduce() in-process, stopped where its first child would start."""

    def stop(command, log, env, **watch):
        raise TrainingWouldStart(command, env)

    monkeypatch.setattr(reproduce_module, "_run_with_env", stop)
    monkeypatch.setenv("REPROCUBE_TEST_SECRET", SECRET)


def files_under(path: Path) -> set[Path]:
    return {p for p in path.rglob("*")} if path.exists() else set()


# --- no value from a file is interpreted ------------------------------------------------------------------
@pytest.mark.process
@pytest.mark.parametrize(
    "value",
    ["${oc.env:REPROCUBE_TEST_SECRET}", "${now:%s}", "\\${x}", "a${b}", "${k}${k}${k}${k}", "\\\\${oc.env:HOME}"],
)
def test_a_receipt_interpolation_reaches_b_as_text_never_resolved(receipt_a, tmp_path, value, until_training):
    """B's config gets the receipt's string itself: nothing of this machine's environment, no clock, no
    doubling bomb (each `${k}` stays four characters)."""
    forged = forge(receipt_a, lambda r: (r["config"]["dataset"].update(name=value), r["dataset"].update(name=value)))
    with pytest.raises(TrainingWouldStart) as started:
        reproduce(write(forged, tmp_path / "pub" / "receipt.json"), tmp_path / "out", [], echo=lambda line: None)
    command = started.value.command
    assert not any(SECRET in arg for arg in command)
    overrides = command[command.index("train") + 1 :]
    assert load_config(overrides).dataset.name == value  # what the child will compose


@pytest.mark.process
def test_an_escaped_interpolation_is_one_line_from_train_and_literal_from_a_config_file(tmp_path):
    proc = reprocube("train", "run_name=\\${x}", cwd=tmp_path, check=False)
    assert proc.returncode == 2 and len(error_lines(proc)) == 1 and "Traceback" not in proc.stderr, proc.stderr
    (tmp_path / "mine.yaml").write_text("run_name: ${oc.env:HOME}\n")
    proc = reprocube("train", "--config-file", "mine.yaml", "--print-config", cwd=tmp_path, check=False)
    assert proc.returncode == 0 and "run_name: ${oc.env:HOME}" in proc.stdout, proc.stdout + proc.stderr


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_categories=("Cs", "Cc")), min_size=1, max_size=40))
def test_a_path_is_one_literal_value_whatever_it_holds(path):
    """config.override is how every path and every receipt value reaches a child: it comes back unchanged,
    `${`, quotes, backslashes, commas and all."""
    if path != path.strip():
        return  # output_dir is refused with surrounding spaces (validate), not changed
    assert load_config([override("output_dir", path)]).output_dir == path


def test_a_key_that_is_not_a_dotted_name_never_becomes_grammar():
    for key in ("seed=1 epochs", "a,b", "+x", "x y", "seed\n"):
        with pytest.raises(ConfigError, match="cannot be a reprocube config key"):
            override(key, 1)


@pytest.mark.process
def test_reproduce_into_a_directory_named_with_grammar(receipt_a, generated, tmp_path):
    """--out 'res,v2' and --out "bob's-results" used to create the directory and fail in B's overrides."""
    published = write(receipt_a, tmp_path / "pub" / "receipt.json")
    for out in ("res,v2", "bob's-results"):
        proc = reprocube(
            "reproduce", str(published), "--out", out, f"data_dir={generated.data_dir}", cwd=tmp_path, check=False
        )
        assert proc.returncode == 0 and "verdict: bit-identical" in proc.stdout, proc.stderr
        assert (tmp_path / out / "reproduce.json").is_file()
    # JSON we write is JSON we can read: every JSON file of B's run, its checkpoints, reproduce and compare.
    runs = tmp_path / "res,v2" / "runs"
    reprocube("compare", str(runs / "b"), str(runs / "b"), "--out", "cmp", cwd=tmp_path)
    written = [p for p in tmp_path.rglob("*") if p.suffix in (".json", ".jsonl") and "pub" not in p.parts]
    assert {"reproduce.json", "compare.json", "receipt.json", "manifest.json", "env.json"} <= {p.name for p in written}
    for path in written:
        if path.suffix == ".json":
            read_json(path, CheckpointError)
        else:
            assert list(iter_json_lines(path, CheckpointError, 1 << 26))


# --- --match sets only documented variables ----------------------------------------------------------------
@pytest.fixture(scope="module")
def hostile_match(generated, tmp_path_factory):
    """A trained under ONEDNN_MAX_CPU_ISA=SSE41, its receipt forged to also hold PYTHONPATH (a
    sitecustomize.py beside it runs code), LD_PRELOAD and an XLA flag that writes files, then reproduced
    with --match: (the directory, reproduce's process, the marker the planted code would write)."""
    tmp_path = tmp_path_factory.mktemp("hostile-match")
    evil = tmp_path / "published"
    evil.mkdir()
    marker = tmp_path / "code-ran"
    (evil / "sitecustomize.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    reprocube(
        "train",
        "framework=pytorch",
        *generated.overrides(),
        *SMALL,
        f"output_dir={tmp_path / 'a'}",
        "run_name=a",
        cwd=tmp_path,
        env_extra={"ONEDNN_MAX_CPU_ISA": "SSE41"},
    )
    genuine = json.loads((tmp_path / "a" / "a" / "receipt.json").read_text())
    hostile = {"PYTHONPATH": str(evil), "LD_PRELOAD": str(evil / "x.so"), "XLA_FLAGS": "--xla_dump_to=/tmp/x"}
    forged = forge(genuine, lambda r: r["env"]["env_vars"].update(hostile))
    proc = reprocube(
        "reproduce",
        str(write(forged, evil / "receipt.json")),
        "--out",
        "out",
        "--match",
        f"data_dir={generated.data_dir}",
        cwd=tmp_path,
        check=False,
    )
    return tmp_path, proc, marker, set(hostile)


@pytest.mark.process
def test_match_never_applies_an_undocumented_variable(hostile_match):
    """B is re-run with A's ISA cap only; the receipt's other variables are reported, never applied."""
    tmp_path, proc, marker, hostile = hostile_match
    assert proc.returncode == 6, proc.stderr  # B differs (it runs without the ISA cap)...
    result = json.loads((tmp_path / "out" / "reproduce.json").read_text())
    assert result["match"]["settings"] == {"ONEDNN_MAX_CPU_ISA": "SSE41"}  # ...and --match applies the cap only
    assert result["match"]["bit_identical"] is True
    assert {row["key"] for row in result["match"]["not_applied"]} == hostile
    assert not marker.exists(), "a receipt's PYTHONPATH ran code"


def _forged_recipe(result: dict, directory: Path) -> None:
    """An attacker's recipe: a key that ends the variable and runs a command."""
    result["match"]["recipe"][0]["env"] = {"OMP_NUM_THREADS=1; touch pwned; true X": "1"}


def _forged_value(result: dict, directory: Path) -> None:
    result["match"]["recipe"][0]["env"]["ONEDNN_MAX_CPU_ISA"] = "$(touch pwned)"


def _other_program(result: dict, directory: Path) -> None:
    result["match"]["recipe"][0]["argv"] = ["bash", "-c", "touch pwned"]


def _foreign_interpreter(result: dict, directory: Path) -> None:
    """The emulator's form, its interpreter a program of the attacker's choice (qemu-user runs any path)."""
    argv = result["match"]["recipe"][0]["argv"]
    result["match"]["recipe"][0]["argv"] = [
        "qemu-x86_64",
        "-cpu",
        "EPYC-Milan-v1",
        "/bin/sh",
        "-m",
        "reprocube",
        *argv[1:],
    ]


def _this_interpreter_without_safe_path(result: dict, directory: Path) -> None:
    """This reprocube's interpreter, but `-m` without -P: run in a handed directory, ./reprocube would load."""
    import sys

    argv = result["match"]["recipe"][0]["argv"]
    result["match"]["recipe"][0]["argv"] = [
        "qemu-x86_64",
        "-cpu",
        "EPYC-Milan-v1",
        sys.executable,
        "-m",
        "reprocube",
        *argv[1:],
    ]


def _control_character(result: dict, directory: Path) -> None:
    """A ^U and a newline inside one quoted word: a paste into a terminal acts on them."""
    result["match"]["recipe"][0]["argv"].append("epochs=1\x15touch pwned\n")


def _grammar_argument(result: dict, directory: Path) -> None:
    result["match"]["recipe"][0]["argv"].append("hydra.searchpath=[file:///tmp]")


def _no_matched_run(result: dict, directory: Path) -> None:
    del result["inputs"]["b_matched_receipt"]


def _settings_the_run_did_not_have(result: dict, directory: Path) -> None:
    result["match"]["recipe"][0]["env"]["ONEDNN_MAX_CPU_ISA"] = "AVX2"  # a valid value, not what ran


def _matched_run_without_as_bits(result: dict, directory: Path) -> None:
    """The matched run swapped for B's (which differs from A), its sha256 recomputed."""
    import hashlib
    import shutil

    shutil.rmtree(directory / "runs" / "b-matched")
    shutil.copytree(directory / "runs" / "b", directory / "runs" / "b-matched")
    raw = (directory / "runs" / "b-matched" / "receipt.json").read_bytes()
    result["inputs"]["b_matched_receipt"]["sha256"] = hashlib.sha256(raw).hexdigest()


@pytest.mark.process
@pytest.mark.parametrize(
    "forgery",
    [
        _forged_recipe,
        _forged_value,
        _other_program,
        _foreign_interpreter,
        _this_interpreter_without_safe_path,
        _control_character,
        _grammar_argument,
        _no_matched_run,
        _settings_the_run_did_not_have,
        _matched_run_without_as_bits,
    ],
)
def test_a_page_offers_a_recipe_only_with_the_match_run_that_proved_it(hostile_match, tmp_path, forgery):
    """A reproduce directory handed to `report`, its reproduce.json edited: the page shows no command to
    copy, says why, and nothing it shows runs anything; the genuine directory shows its recipe."""
    import shutil

    directory = tmp_path / "handed"
    shutil.copytree(hostile_match[0] / "out", directory)
    reprocube("report", str(directory), "--out", str(tmp_path / "genuine"), cwd=tmp_path)
    page = (tmp_path / "genuine" / "report.html").read_text()
    assert "<pre class='recipe'>ONEDNN_MAX_CPU_ISA=SSE41 reprocube train " in page
    result = json.loads((directory / "reproduce.json").read_text())
    forgery(result, directory)
    (directory / "reproduce.json").write_text(json.dumps(result))
    reprocube("report", str(directory), "--out", str(tmp_path / "forged"), cwd=tmp_path)
    what_to_do = (tmp_path / "forged" / "report.html").read_text().split("What to do")[1].split("<h2")[0]
    assert "<pre class='recipe'>" not in what_to_do and "button" not in what_to_do, what_to_do
    assert "no command to run is shown: " in what_to_do, what_to_do
    assert not (tmp_path / "pwned").exists()


@pytest.mark.process
def test_a_receipt_env_var_that_cannot_be_a_variable_is_refused(receipt_a, tmp_path):
    for bad in ({"A=B": "1"}, {"X": 3}, {"X": "a\0b"}):
        forged = forge(receipt_a, lambda r, bad=bad: r["env"]["env_vars"].update(bad))
        proc = reprocube("reproduce", str(write(forged, tmp_path / "r.json")), "--out", "o", cwd=tmp_path, check=False)
        assert proc.returncode == 4 and len(error_lines(proc)) == 1 and "env_vars" in proc.stderr, proc.stderr
        assert not (tmp_path / "o").exists()


# --- names and terminal output ------------------------------------------------------------------------------
@pytest.mark.process
def test_a_run_name_cannot_leave_the_current_directory(receipt_a, tmp_path, until_training, monkeypatch):
    cwd = tmp_path / "here" / "deep"
    cwd.mkdir(parents=True)
    monkeypatch.chdir(cwd)
    forged = forge(receipt_a, lambda r: r["config"].update(run_name="../../../../elsewhere"))
    with pytest.raises(TrainingWouldStart):
        reproduce(write(forged, tmp_path / "pub" / "receipt.json"), None, [], echo=lambda line: None)
    assert [p.name for p in cwd.iterdir()] == ["reproduce-elsewhere"]
    assert {p.name for p in tmp_path.iterdir()} == {"here", "pub"}


def test_safe_names():
    assert safe_name("../../x") == "x" and safe_name("..") == "unnamed" and safe_name("a\x1b[2Jb") == "a_2Jb"
    assert safe_name("pytorch-seed1") == "pytorch-seed1" and len(safe_name("x" * 500)) == 64


@pytest.mark.process
def test_terminal_control_from_a_file_is_shown_escaped(tmp_path):
    forged_line = "\x1b[2J\x1b[1A\x1b[2Kverdict: bit-identical\r\u202e\x9b"
    assert "\x1b" not in printable(forged_line) and "\\x1b[2J" in printable(forged_line)
    assert printable("tab\tand\nnewline") == "tab\tand\nnewline" and printable("\ud800") == "\\ud800"
    (tmp_path / "mine.yaml").write_text(json.dumps({forged_line: 1}))  # the key is echoed in the error line
    proc = reprocube("train", "--config-file", "mine.yaml", cwd=tmp_path, check=False)
    assert proc.returncode == 2 and "\x1b" not in proc.stderr and "\r" not in proc.stderr, repr(proc.stderr)
    assert "\\x1b" in proc.stderr


# --- bounded work -----------------------------------------------------------------------------------------
@pytest.mark.process
def test_a_receipt_asks_for_no_more_work_than_it_records(receipt_a, tmp_path, until_training, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for change, message in (
        (lambda r: r["config"].update(epochs=10**9), "disagrees with position"),  # complete, yet 1e9 epochs
        (lambda r: r["config"]["data"].update(train_limit=40), "more than its data and batch_size allow"),
        (lambda r: r["epochs"][0].update(global_step=20), "one number of steps per epoch"),
    ):
        path = write(forge(receipt_a, change), tmp_path / "pub" / "receipt.json")
        with pytest.raises(ReprocubeError, match=message):
            reproduce(path, tmp_path / "out", [], echo=lambda line: None)
        assert not (tmp_path / "out").exists()
    # A stopped run that claims a billion epochs: B trains what A's records show, never more.
    stopped = forge(receipt_a, lambda r: r["config"].update(epochs=10**9) or r.update(complete=False))
    with pytest.raises(TrainingWouldStart) as started:
        reproduce(write(stopped, tmp_path / "pub" / "receipt.json"), tmp_path / "out", [], echo=lambda line: None)
    assert "epochs=2" in started.value.command


@pytest.mark.process
def test_batch_sizes_and_threads_beyond_sane_bounds_are_refused(tmp_path):
    for override_text in ("batch_size=1000000000", "test_batch_size=100000000", "threads=100000"):
        proc = reprocube("train", override_text, "--print-config", cwd=tmp_path, check=False)
        assert proc.returncode == 2 and len(error_lines(proc)) == 1, proc.stderr


# --- what a signature covers ------------------------------------------------------------------------------
@pytest.mark.process
def test_an_unsigned_study_beside_a_signed_receipt_is_ignored_and_said(receipt_a, tmp_path, until_training):
    from reprocube.training.signing import generate_key, sign_receipt

    published = write(receipt_a, tmp_path / "pub" / "receipt.json")
    (published.parent / "study.json").write_text("{}")  # never read: it is not covered by the signature
    public = generate_key(tmp_path / "key")
    sign_receipt(published, tmp_path / "key")
    lines = []
    with pytest.raises(TrainingWouldStart):
        reproduce(published, tmp_path / "out", [], public_key=public, echo=lines.append)
    assert any("signature: verified" in line and "covers receipt.json only" in line for line in lines), lines
    assert any("study.json: beside the signed receipt, not signed: ignored" in line for line in lines), lines


@pytest.mark.process
def test_a_signature_beside_an_unchecked_receipt_is_named(receipt_a, tmp_path, until_training):
    published = write(receipt_a, tmp_path / "pub" / "receipt.json")
    (published.parent / "receipt.sig").write_text("{}")
    lines = []
    with pytest.raises(TrainingWouldStart):
        reproduce(published, tmp_path / "out", [], echo=lines.append)
    assert any("NOT checked (pass --public-key)" in line for line in lines), lines


# --- JSON we write is JSON we can read ----------------------------------------------------------------------
def test_the_one_json_writer_refuses_what_json_cannot_hold():
    for value in ({"a": float("nan")}, [1, float("-inf")], {"x": {"y": float("inf")}}):
        with pytest.raises(ValueError, match="JSON cannot hold"):
            json_text(value)
    assert receipt_comparison._ratio(0.5, 5e-324) is None and receipt_comparison._ratio(1.0, 2.0) == 0.5


@pytest.mark.process
def test_sign_with_a_directory_as_the_new_key_is_one_line(receipt_a, tmp_path):
    published = write(receipt_a, tmp_path / "pub" / "receipt.json")
    proc = reprocube("sign", str(published), "--key", ".", "--new-key", cwd=tmp_path, check=False)
    assert proc.returncode == 2 and len(error_lines(proc)) == 1 and "Traceback" not in proc.stderr


# --- every mutation: one line, a documented exit, nothing outside --out, nothing of the environment ---------
HOSTILE_VALUES = st.one_of(
    st.sampled_from(
        [
            "${oc.env:REPROCUBE_TEST_SECRET}",
            "../../../../elsewhere",
            "a\0b",
            "\x1b[2J",
            "$\\foo$",
            "x,y",
            "'",
            "\\",
            "=",
            "",
            " ",
            "\ud800",
            "A=B",
        ]
    ),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.booleans(),
    st.none(),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=2),
    st.text(max_size=30),
)


def _paths(value, prefix=()):
    """Every (path, value) in a JSON value, the trace's big string left out (it has tests of its own)."""
    yield prefix
    if isinstance(value, dict):
        for key, item in value.items():
            if key != LOSS_KEYS[TRACE_VERSION]:
                yield from _paths(item, (*prefix, key))
    elif isinstance(value, list):
        for i, item in enumerate(value[:3]):
            yield from _paths(item, (*prefix, i))


@pytest.mark.process
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_mutated_receipt_is_refused_in_one_line_or_trained_as_data(receipt_a, tmp_path_factory, data, monkeypatch):
    root = tmp_path_factory.mktemp("fuzz")
    cwd = root / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    monkeypatch.setenv("REPROCUBE_TEST_SECRET", SECRET)
    monkeypatch.setattr(
        reproduce_module,
        "_run_with_env",
        lambda c, log, env, **watch: (_ for _ in ()).throw(TrainingWouldStart(c, env)),
    )
    paths = [p for p in _paths(receipt_a) if p and p[0] not in ("receipt_sha256", "config_hash")]
    where = data.draw(st.sampled_from(paths))
    value = data.draw(HOSTILE_VALUES)

    def change(r):
        target = r
        for key in where[:-1]:
            target = target[key]
        target[where[-1]] = value

    forged = json.loads(json.dumps(receipt_a))
    change(forged)
    try:
        forged["config_hash"] = config_hash(forged["config"])
    except (TypeError, AttributeError, KeyError):
        pass  # a config that is no longer a mapping: its hash stays as it was
    forged["receipt_sha256"] = self_digest(forged) if isinstance(forged, dict) else None
    published = root / "pub" / "receipt.json"
    published.parent.mkdir()
    published.write_text(json.dumps(forged))
    before = files_under(root)
    lines = []
    try:
        reproduce(published, None, [], echo=lines.append, match=True)
    except TrainingWouldStart as started:
        assert all(SECRET not in arg for arg in started.command)
        assert started.env is None  # B itself runs in this machine's environment, not the receipt's
        for arg in started.command[started.command.index("train") + 1 :]:
            assert "\0" not in arg
    except ReprocubeError as refused:
        message = str(refused)
        assert "\n" not in message and SECRET not in message and refused.exit_code in (2, 4), message
    new = files_under(root) - before
    assert all(cwd in p.parents for p in new), sorted(new)  # nothing outside the current directory
    assert all(SECRET not in line and "\n" not in line for line in lines)


def test_verify_hands_a_path_holding_grammar_to_its_children_as_one_value(tmp_path):
    """verify "run='runs/a,b'" said NOT reproducible: the checkpoint paths went unquoted into the links."""
    from reprocube.orchestration.verify_plan import plan_full, plan_linear

    cfg = load_config(["epochs=2"])
    reference = tmp_path / "runs" / "a,b 'c' ${x}"
    plans = plan_linear(cfg, 21, reference, [1, 2]) + plan_full(cfg, 21, reference)
    args = [arg for check in plans for stage in check.stages for arg in stage.args]
    resumes = [arg for arg in args if arg.startswith("resume=") and arg != "resume=latest"]
    assert len(resumes) >= 2
    for arg in resumes:
        assert load_config([arg]).resume == str((reference / "checkpoints" / "epoch-0001").resolve())


# --- found by an adversarial review -------------------------------------------------------------------------
@pytest.mark.process
def test_hydra_settings_from_a_file_are_refused(receipt_a, tmp_path, until_training, monkeypatch):
    """hydra.searchpath in a receipt loaded a config group shipped beside it, whose interpolation printed
    the reproducer's environment in the error line."""
    evil = tmp_path / "pub" / "conf" / "framework"
    evil.mkdir(parents=True)
    (evil / "evil.yaml").write_text("name: evil\nleak: ${framework.${oc.env:REPROCUBE_TEST_SECRET}}\n")
    monkeypatch.chdir(tmp_path)

    def change(r):
        r["config"]["hydra"] = {"searchpath": [f"file://{tmp_path / 'pub' / 'conf'}"]}
        r["config"]["framework"]["name"] = "evil"

    with pytest.raises(ReprocubeError) as refused:
        reproduce(
            write(forge(receipt_a, change), tmp_path / "pub" / "receipt.json"),
            tmp_path / "out",
            [],
            echo=lambda line: None,
        )
    assert SECRET not in str(refused.value) and "hydra" in str(refused.value)
    (tmp_path / "mine.yaml").write_text(
        f"hydra:\n  searchpath: ['file://{tmp_path / 'pub' / 'conf'}']\nframework: evil\n"
    )
    proc = reprocube(
        "train", "--config-file", "mine.yaml", cwd=tmp_path, check=False, env_extra={"REPROCUBE_TEST_SECRET": SECRET}
    )
    assert proc.returncode == 2 and SECRET not in proc.stderr + proc.stdout, proc.stderr


@pytest.mark.process
def test_a_receipt_without_the_records_of_its_epochs_is_refused(receipt_a, tmp_path, until_training):
    def billion_epochs(r, records):
        r["config"]["epochs"] = r["position"]["epoch"] = 10**9
        r["epochs"] = records(r["epochs"])

    for records in (lambda e: [], lambda e: [{**e[-1], "epoch": 10**9, "global_step": 21 * 10**9}]):
        forged = forge(receipt_a, lambda r, records=records: billion_epochs(r, records))
        with pytest.raises(ReprocubeError, match="epochs"):
            reproduce(write(forged, tmp_path / "pub" / "receipt.json"), tmp_path / "out", [], echo=lambda line: None)


@pytest.mark.process
def test_dataset_names_are_names_and_classes_are_bounded(tmp_path):
    for bad in (
        "dataset.files.train_labels.name=/proc/self/environ",
        "dataset.name=../x",
        "dataset.files.test_images.name=..",
        "dataset.num_classes=4611686018427387904",
    ):
        proc = reprocube("train", bad, "--print-config", cwd=tmp_path, check=False)
        assert proc.returncode == 2 and len(error_lines(proc)) == 1, (bad, proc.stderr)


def test_a_value_shown_inside_a_line_cannot_start_a_line_of_its_own():
    from reprocube.terminal import one_line, shown_value

    forged = "AMD EPYC\n\nverdict: bit-identical (8 steps)\twritten: x\x1b[2K"
    assert "\n" not in one_line(forged) and "\t" not in one_line(forged) and "\x1b" not in one_line(forged)
    assert "\n" not in shown_value(forged)


@pytest.mark.process
def test_a_path_that_is_not_utf8_is_one_line(tmp_path):
    odd = os.fsdecode(b"bad\xff")
    proc = reprocube("compare", odd, "other", cwd=tmp_path, check=False)
    assert proc.returncode == 2 and len(error_lines(proc)) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert not [p for p in tmp_path.iterdir()]


@pytest.mark.process
def test_edited_epoch_metrics_are_flagged_never_rated_within_ulp(receipt_a, generated, tmp_path):
    """A receipt whose final test accuracy was edited (hashes recomputed, unsigned): every step and weight
    digest reproduces, the metrics do not; the tier is metrics-disagree, the exit status 6."""

    def edit(receipt):
        receipt["epochs"][-1]["test_accuracy"] = 0.9

    published = write(forge(receipt_a, edit), tmp_path / "pub" / "receipt.json")
    proc = reproduce_receipt(published, tmp_path / "r", generated.data_dir, cwd=tmp_path)
    assert proc.returncode == 6, proc.stderr
    result = json.loads((tmp_path / "r" / "reproduce.json").read_text())
    assert result["first_divergence"] is None and result["tier"] == "metrics-disagree", result["tier_text"]
    assert "within" not in result["tier_text"] and "test_accuracy" in result["tier_text"]


@pytest.mark.process
def test_a_code_difference_names_the_source_files_that_differ(receipt_a, tmp_path):
    from reprocube.analysis.receipt_comparison import ranked_causes
    from reprocube.training.receipt import read_receipt

    assert "training/loop.py" in receipt_a["reprocube"]["source_files"]

    def patched(receipt):
        receipt["reprocube"]["source_sha256"] = "0" * 64
        receipt["reprocube"]["source_files"]["training/loop.py"] = "0" * 16
        receipt["reprocube"]["source_files"]["extra/patch.py"] = "1" * 16

    a = read_receipt(write(receipt_a, tmp_path / "a" / "receipt.json"))
    b = read_receipt(write(forge(receipt_a, patched), tmp_path / "b" / "receipt.json"))
    code = [c for c in ranked_causes(a, b, []) if c["kind"] == "code"]
    assert len(code) == 1 and code[0]["note"] == "files that differ: extra/patch.py (only in B), training/loop.py", code


@pytest.mark.process
@pytest.mark.parametrize("name", ["../../etc/passwd", "/abs.py", "a/../../b.py", "x\ny.py"])
def test_a_source_file_name_is_a_relative_path_or_the_receipt_is_refused(receipt_a, tmp_path, name):
    from reprocube.training.receipt import read_receipt

    def planted(receipt):
        receipt["reprocube"]["source_files"][name] = "0" * 16

    with pytest.raises(CheckpointError, match="is not a relative source path"):
        read_receipt(write(forge(receipt_a, planted), tmp_path / "receipt.json"))


@pytest.mark.process
def test_initial_weights_that_differ_are_named_as_such_not_as_the_first_update(receipt_a, generated, tmp_path):
    """A's digests of its initial weights (the trace's boundary at global step 0) differ from B's for one
    tensor (A's trace edited, hashes recomputed): the verdict names the initial weights, before any update,
    and that tensor; not "the first update that changed the weights"."""
    assert receipt_a["trace"]["boundaries"][0][0] == 0  # a fresh run records its initial weights

    def other_initial_conv1_bias(receipt):
        trace = receipt["trace"]
        index = trace["tensor_names"].index("conv1.bias")
        trace["boundaries"][0][1][index] = "0123456789abcdef"

    published = write(forge(receipt_a, other_initial_conv1_bias), tmp_path / "pub" / "receipt.json")
    proc = reproduce_receipt(published, tmp_path / "r", generated.data_dir, cwd=tmp_path)
    assert proc.returncode == 6, proc.stderr
    result = json.loads((tmp_path / "r" / "reproduce.json").read_text())
    first = result["first_divergence"]
    assert result["verdict"] == "differs" and first["initial_tensors"] == ["conv1.bias"] and first["step"] == 1
    # The summary and reproduce.md word it alike (results.wording.first_update_text).
    assert "the initial weights already differ, before any update: conv1.bias (1 tensor)" in result["summary"]
    report = (tmp_path / "r" / "reproduce.md").read_text()
    assert "the initial weights already differ, before any update: conv1.bias (1 tensor)" in report
    assert "the first update that changed the weights" not in report


@pytest.mark.process
def test_a_loss_bit_changed_and_nothing_else_is_losses_only_exit_7(receipt_a, generated, tmp_path):
    """Every weight digest reproduces and one step's loss bits do not (A's trace edited, hashes recomputed):
    the verdict says the trained model is bit-identical and only the losses differ."""
    import numpy as np

    def one_loss_bit(receipt):
        trace, key = receipt["trace"], LOSS_KEYS[TRACE_VERSION]
        bits = decode_losses(trace[key], trace["steps"], key, CheckpointError).view(np.uint32).copy()
        bits[6] ^= 1
        trace[key] = encode_losses(bits.view(np.float32))

    published = write(forge(receipt_a, one_loss_bit), tmp_path / "pub" / "receipt.json")
    proc = reproduce_receipt(published, tmp_path / "r", generated.data_dir, cwd=tmp_path)
    assert proc.returncode == 7, proc.stderr
    result = json.loads((tmp_path / "r" / "reproduce.json").read_text())
    assert result["verdict"] == "losses-only" and result["tier"] == "losses-only"
    assert result["first_divergence"]["step"] == 7 and result["first_divergence"]["weights_identical"] is True
    assert result["summary"].startswith("the trained model is bit-identical; only the reported losses differ")
    assert "the trained model is bit-identical" in (tmp_path / "r" / "report.html").read_text()


@pytest.mark.process
def test_a_reprocube_py_where_a_child_starts_is_never_imported(tmp_path):
    """Issue 55, second attack round N1: every child reprocube starts (B's training, verify's runs, a
    replay) was `python -m reprocube ...` in the user's directory, and `-m` puts that directory first on
    sys.path: a reprocube.py handed with a receipt ran in reprocube's place. -P keeps it off."""
    from reprocube.orchestration.children import reprocube_command

    marker = tmp_path / "ran"
    (tmp_path / "reprocube.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    ran = subprocess.run(reprocube_command("--help"), cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0 and "usage: reprocube" in ran.stdout, ran.stderr
    assert not marker.exists(), "a reprocube.py in the child's directory was imported"
