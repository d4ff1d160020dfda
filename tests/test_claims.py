"""Issue 35: no verdict says more than was compared. Each case is an attack or a misleading statement found
against reproduce and report, rebuilt with the project's own hashing (tests/forge.py): a claim B never
checks, a weight claim that stops before A's last step, a self-check at an epoch's last step, a result
that points report at files outside its directory, work beyond what A did, and inputs nested past what
OmegaConf survives."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import numpy as np
import pytest

from forge import drop_fingerprints, losses, set_losses, write_forged
from reprocube.analysis.claims import BOUNDARY_DIGESTS, NOT_CHECKED
from reprocube.analysis.match_plan import match_plan
from reprocube.analysis.receipt_comparison import compare_receipts
from reprocube.commands.reproduce import reproduce
from reprocube.errors import CheckpointError
from reprocube.formats.env import threads_warning
from reprocube.training.receipt import RECEIPT, read_receipt

from helpers import error_lines, reprocube

STEPS_PER_EPOCH = 21  # the generated dataset: 650 examples, batch 32
SMALL = ["epochs=2", "trace.every_steps=5"]


def quiet(_line: str) -> None:
    pass


def train(generated, root: Path, name: str, *extra: str, expect: int = 0) -> Path:
    proc = reprocube(
        "train",
        "framework=pytorch",
        *generated.overrides(),
        *SMALL,
        f"output_dir={root}",
        f"run_name={name}",
        *extra,
        cwd=root,
        check=False,
    )
    assert proc.returncode == expect, proc.stderr
    return root / name


@pytest.fixture(scope="module")
def runs(generated, tmp_path_factory) -> dict[str, Path]:
    """A genuine 2-epoch run, and one stopped at global step 24 (a partial receipt), both PyTorch."""
    root = tmp_path_factory.mktemp("claims")
    return {
        "full": train(generated, root, "full"),
        "partial": train(generated, root, "partial", "preempt_at_step=24", expect=75),
    }


def receipt_value(run: Path) -> dict:
    return json.loads((run / RECEIPT).read_bytes())


@pytest.mark.process
def test_a_claim_b_never_records_is_not_checked_and_reproduce_records_it(runs, generated, tmp_path):
    """A boundary at a step B's cadence never digests (made-up digests): in-process against the genuine
    B it is 8 claims not checked, never bit-identical; reproduce has B digest its weights there, and
    the made-up digests differ."""
    forged = receipt_value(runs["full"])
    boundaries = forged["trace"]["boundaries"]
    boundaries.insert(2, [7, ["0123456789abcdef"] * len(forged["trace"]["tensor_names"])])
    a = write_forged(forged, tmp_path / "forged")
    outcome = compare_receipts(read_receipt(a), read_receipt(runs["full"]))
    assert outcome["verdict"] == "differs" and not outcome["identical"]
    assert outcome["claims"]["kinds"][BOUNDARY_DIGESTS][NOT_CHECKED] == 8
    assert any(r.startswith("not checked: 8 boundary weight digests") for r in outcome["reasons"]), outcome["reasons"]

    result = reproduce(a, tmp_path / "out", [f"data_dir={generated.data_dir}"], echo=quiet)
    assert result["verdict"] == "differs" and result["claims"]["totals"]["not_checked"] == 0, result["claims"]
    assert result["first_divergence"]["first_differing_boundary"] == 7, result["first_divergence"]
    assert 7 in [b.step for b in read_receipt(tmp_path / "out" / "runs" / "b").trace.boundaries]


@pytest.mark.process
def test_losses_only_needs_a_weight_claim_at_as_last_step(runs, tmp_path):
    """A partial receipt without fingerprints whose losses after the epoch's end come from another model:
    its only weight claims end at step 21, so the model is not said to be bit-identical (before: losses-only)."""
    forged = receipt_value(runs["partial"])
    drop_fingerprints(forged)
    forged["trace"]["boundaries"] = [b for b in forged["trace"]["boundaries"] if b[0] <= STEPS_PER_EPOCH]
    values = losses(forged)
    values[STEPS_PER_EPOCH:] *= np.float32(1.25)  # steps 22..24: another model's losses
    set_losses(forged, values)
    outcome = compare_receipts(read_receipt(write_forged(forged, tmp_path / "forged")), read_receipt(runs["partial"]))
    assert outcome["verdict"] == "differs", outcome
    assert outcome["first_divergence"]["step"] == STEPS_PER_EPOCH + 1
    assert any("compared only up to global step 21, not at its last step 24" in r for r in outcome["reasons"])


@pytest.mark.process
def test_a_differing_partial_receipt_is_said_partial_and_b_trains_only_to_where_a_stopped(runs, generated, tmp_path):
    """The first difference at the last step of epoch 1 (the self-check stops B there: it used to write a
    receipt its own reader refused, and reproduce ended with exit 4 and no verdict); B trains steps 1..24
    only, as A did, and every line that states the verdict says partial."""
    forged = receipt_value(runs["partial"])
    values = losses(forged)
    values.view(np.uint32)[STEPS_PER_EPOCH - 1] ^= 1  # the loss bits of step 21, the epoch's last
    set_losses(forged, values)
    a = write_forged(forged, tmp_path / "forged")
    proc = reprocube(
        "reproduce", str(a), "--out", str(tmp_path / "out"), f"data_dir={generated.data_dir}", cwd=tmp_path, check=False
    )
    assert proc.returncode == 7, proc.stderr  # losses-only: every weight claim agrees, one at step 24
    result = json.loads((tmp_path / "out" / "reproduce.json").read_text())
    assert result["first_divergence"]["step"] == STEPS_PER_EPOCH
    assert result["self_consistent"] is True and result["self_check"]["to_step"] == STEPS_PER_EPOCH
    assert read_receipt(tmp_path / "out" / "runs" / "b").global_step == 24  # not the whole epoch 2
    for text in (result["summary"], result["tier_text"], (tmp_path / "out" / "reproduce.md").read_text()):
        assert "partial" in text and "A stopped at global step 24" in text, text
    assert "partial: A stopped at global step 24 (epoch 2); B trains to there" in proc.stdout
    assert "1 epochs" not in proc.stdout + proc.stderr
    again = read_receipt(tmp_path / "out" / "runs" / "b-again")  # stopped at the epoch's last step: readable
    assert (again.epoch, again.value["position"]["step_in_epoch"], again.global_step) == (1, 0, STEPS_PER_EPOCH)


@pytest.fixture(scope="module")
def reproduced(runs, generated, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("reproduced") / "out"
    reproduce(runs["full"], out, [f"data_dir={generated.data_dir}"], echo=quiet)
    return out


def copy_of(directory: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "copy"
    shutil.copytree(directory, copy, ignore=shutil.ignore_patterns("*.png", "report.html"))
    return copy


def report_of(directory: Path, tmp_path: Path, page: str = "refused"):
    return reprocube("report", str(directory), "--out", str(tmp_path / page), cwd=tmp_path, check=False)


@pytest.mark.process
def test_report_reads_only_inside_the_reproduce_directory(reproduced, runs, tmp_path):
    """A result naming B's run anywhere on the reader's machine (or in the cwd), a receipt replaced in A's
    place, a link where a receipt was: one line, exit 4, nothing drawn. The genuine one draws."""
    assert report_of(reproduced, tmp_path, "drawn").returncode == 0
    result = json.loads((reproduced / "reproduce.json").read_text())
    # One count of boundaries everywhere the verdict is said: those after the initial weights.
    said = f"{result['coverage']['compared_boundaries']} weight-digest boundaries after the initial weights"
    assert said in result["tier_text"] and said in (reproduced / "reproduce.md").read_text()
    assert said in (tmp_path / "drawn" / "report.html").read_text()
    assert result["run_b"] == "runs/b" and set(result["inputs"]) == {"a_receipt", "b_receipt"}

    for run_b in (str(runs["partial"]), "runs/partial", "../b"):
        copy = copy_of(reproduced, tmp_path)
        (copy / "reproduce.json").write_text(json.dumps(result | {"run_b": run_b}))
        proc = report_of(copy, tmp_path)
        assert proc.returncode == 4 and "run_b must be 'runs/b'" in error_lines(proc)[-1], proc.stderr
        shutil.rmtree(copy)

    copy = copy_of(reproduced, tmp_path)
    shutil.copy(runs["partial"] / RECEIPT, copy / "a" / RECEIPT)  # another genuine receipt in A's place
    proc = report_of(copy, tmp_path)
    assert proc.returncode == 4 and "is not the receipt this result compared" in error_lines(proc)[-1]
    shutil.rmtree(copy)

    copy = copy_of(reproduced, tmp_path)
    (copy / "runs" / "b" / RECEIPT).unlink()
    (copy / "runs" / "b" / RECEIPT).symlink_to(reproduced / "runs" / "b" / RECEIPT)
    proc = report_of(copy, tmp_path)
    assert proc.returncode == 4 and "symbolic link" in error_lines(proc)[-1], proc.stderr
    shutil.rmtree(copy)

    copy = copy_of(reproduced, tmp_path)  # B's run directory a link out of the reproduce directory
    shutil.rmtree(copy / "runs" / "b")
    (copy / "runs" / "b").symlink_to(reproduced / "runs" / "b", target_is_directory=True)
    proc = report_of(copy, tmp_path)
    assert proc.returncode == 4 and "runs/b is a symbolic link" in error_lines(proc)[-1], proc.stderr
    assert not (tmp_path / "refused" / "report.html").exists()


@pytest.mark.process
def test_match_starts_one_process_per_change_of_settings(runs):
    """32 sessions, the first under another ISA cap and 31 one-step sessions under equal settings: two
    segments (before: one process per session that differs from B's)."""
    a = read_receipt(runs["full"])
    capped = {**a.env, "env_vars": {**a.env["env_vars"], "ONEDNN_MAX_CPU_ISA": "SSE41"}}
    a.sessions = [{"from_step": 0, "to_step": 11, "env": capped}]
    a.sessions += [{"from_step": s, "to_step": s + 1, "env": a.env} for s in range(11, 42)]
    assert len(a.sessions) == 32
    plan = match_plan(a, read_receipt(runs["full"]), [])
    assert [(s["from_step"], s["to_step"]) for s in plan["segments"]] == [(0, 11), (11, 42)]


def _capped(env: dict, isa: str) -> dict:
    return {**env, "env_vars": {**env["env_vars"], "ONEDNN_MAX_CPU_ISA": isa}}


@pytest.mark.process
def test_match_follows_a_bounded_number_of_changes_of_settings(runs):
    """Sessions alternating between two ISA caps: up to MAX_MATCH_PROCESSES segments are followed, one
    more is refused, named, with nothing emulated."""
    from reprocube.analysis.match_plan import MAX_MATCH_PROCESSES

    a, b = read_receipt(runs["full"]), read_receipt(runs["full"])

    def alternating(count: int) -> list[dict]:
        cuts = [*range(count), 42]
        caps = ("SSE41", "AVX2")
        return [
            {"from_step": cuts[i], "to_step": cuts[i + 1], "env": _capped(a.env, caps[i % 2])} for i in range(count)
        ]

    a.sessions = alternating(MAX_MATCH_PROCESSES)
    assert len(match_plan(a, b, [])["segments"]) == MAX_MATCH_PROCESSES
    a.sessions = alternating(MAX_MATCH_PROCESSES + 1)
    plan = match_plan(a, b, [])
    assert plan["segments"] is None and plan["settings"] == {} and plan["cpu"] is None
    assert plan["refused"].startswith(f"A's sessions change settings {MAX_MATCH_PROCESSES} times"), plan["refused"]


@pytest.mark.process
def test_match_costs_no_more_for_alternating_sessions_than_for_one(runs, generated, tmp_path):
    """A receipt whose 16 one-step sessions alternate between two ISA caps, against the same receipt as one
    session under one cap (each with a last loss bit changed, so that B differs and --match runs): at most
    2x plus 30 s (before: one process per session, 121 s against 21 s), and the answer says why nothing
    was emulated."""
    genuine = receipt_value(runs["full"])
    timings, results = {}, {}
    for name in ("one", "alternating"):
        forged = json.loads(json.dumps(genuine))
        changed = losses(forged)
        changed[-1] = np.nextafter(changed[-1], np.float32(np.inf))  # B differs at the last step
        set_losses(forged, changed)
        if name == "one":
            forged["env"] = _capped(forged["env"], "SSE41")
            forged["sessions"] = [{"from_step": 0, "to_step": 42, "env": None}]
        else:
            cuts = [*range(16), 42]
            forged["sessions"] = [
                {"from_step": cuts[i], "to_step": cuts[i + 1], "env": _capped(forged["env"], ("SSE41", "AVX2")[i % 2])}
                for i in range(16)
            ]
        a = write_forged(forged, tmp_path / name)
        started = time.perf_counter()
        results[name] = reproduce(
            a, tmp_path / f"out-{name}", [f"data_dir={generated.data_dir}"], match=True, echo=quiet
        )
        timings[name] = time.perf_counter() - started
    print(f"\n--match: one session {timings['one']:.1f} s, 16 alternating sessions {timings['alternating']:.1f} s")
    assert results["one"]["match"]["ran"] is True
    refused = results["alternating"]["match"]
    assert refused["ran"] is False and refused["summary"].startswith("A's sessions change settings 15 times")
    assert not (tmp_path / "out-alternating" / "runs" / "b-matched").exists()
    assert timings["alternating"] <= 2 * timings["one"] + 30, timings


@pytest.mark.process
def test_counts_are_bounded_by_the_model(runs, tmp_path):
    """20,000 tensor names (a 1.3 MB receipt) are refused by the reader in one line, in well under a second
    (before: 7.2 GB and over 300 s in the divergence map)."""
    forged = receipt_value(runs["full"])
    drop_fingerprints(forged)
    names = [f"t{i:05d}.weight" for i in range(20_000)]
    forged["trace"]["tensor_names"] = names
    forged["trace"]["boundaries"] = [[b[0], [b[1][0]] * len(names)] for b in forged["trace"]["boundaries"][:2]]
    a = write_forged(forged, tmp_path / "forged")
    started = time.perf_counter()
    with pytest.raises(CheckpointError, match="trace.tensor_names are not the weight tensors of the 'pytorch' model"):
        read_receipt(a)
    assert time.perf_counter() - started < 5


@pytest.mark.process
def test_threads_beyond_the_usable_cpus_are_said_before_training(runs, generated, tmp_path):
    forged = receipt_value(runs["full"])
    forged["config"]["threads"] = 1024
    a = write_forged(forged, tmp_path / "forged")
    proc = reprocube(
        "reproduce", str(a), "--out", str(tmp_path / "out"), f"data_dir={generated.data_dir}", cwd=tmp_path, check=False
    )
    [line] = error_lines(proc)
    assert proc.returncode == 2 and "threads=1024 but this process may use" in line, proc.stderr
    assert "--allow-oversubscribe" in line and "slower" in line and not (tmp_path / "out").exists()
    jax = threads_warning("jax", 4, 2)
    assert "WILL DIFFER" in jax and "WILL DIFFER" not in threads_warning("pytorch", 4, 2)
    assert threads_warning("jax", 2, 2) is None


@pytest.mark.process
@pytest.mark.parametrize("depth", [100, 600])
def test_a_config_value_nested_deeply_is_one_line(runs, tmp_path, depth):
    forged = receipt_value(runs["full"])
    value: list = [1]
    for _ in range(depth):
        value = [value]
    forged["config"]["optimizer"]["lr"] = value
    a = write_forged(forged, tmp_path / "forged")
    proc = reprocube("reproduce", str(a), "--out", str(tmp_path / "out"), cwd=tmp_path, check=False)
    [line] = error_lines(proc)
    assert proc.returncode == 4 and "nested too deeply (more than 32 levels)" in line and "Traceback" not in proc.stderr


def test_a_losses_only_replay_never_names_the_update(tmp_path):
    """With the weights proven equal after every step, an unrecorded operation that differs is the loss's
    reduction, never "the optimizer's update" (JAX records kernels only)."""
    from reprocube.orchestration.operation_replay import first_operation
    from test_first_operation import A, recording

    def run_child(command: list[str], log: Path, env) -> int:
        out = Path(command[command.index("--out") + 1])
        out.write_text(json.dumps(recording(A) | {"framework": "jax"}))
        return 0

    for weights_identical, expected, absent in (
        (True, "the loss's reduction", "the optimizer's update"),
        (False, "the optimizer's update", "the loss's reduction"),
    ):
        found = first_operation(
            "jax",
            6,
            tmp_path / "b",
            tmp_path / "m",
            {},
            tmp_path / f"ops-{weights_identical}",
            tmp_path,
            [],
            run_child,
            weights_identical=weights_identical,
        )
        assert found["status"] == "none" and expected in found["text"] and absent not in found["text"], found


@pytest.mark.process
def test_compare_names_the_checkpoints_it_did_not_compare(runs, generated, tmp_path):
    """A run stopped at step 24 and resumed holds step-000024, which the uninterrupted run lacks: their
    weights agree where both have checkpoints, and the verdict names the one it did not compare."""
    shutil.copytree(runs["partial"], tmp_path / "resumed")
    resumed = train(generated, tmp_path, "resumed", "resume=latest")
    compared = reprocube(
        "compare", str(runs["full"]), str(resumed), "--out", str(tmp_path / "c"), cwd=tmp_path, check=False
    )
    assert compared.returncode == 0, compared.stdout + compared.stderr
    assert "identical (2 checkpoints); not compared (one run only): B:step-000024" in compared.stdout
    result = json.loads((tmp_path / "c" / "compare.json").read_text())
    assert result["not_compared_checkpoints"] == {"a": [], "b": ["step-000024"]}


def genuine(framework: str = "pytorch") -> Path:
    return Path(__file__).parent / "receipts" / "avx512" / framework


def verdict_of(value: dict, tmp_path: Path, name: str = "forged") -> str:
    """The verdict of a forged A against the genuine receipt as B (refused: the reader's one line)."""
    try:
        return compare_receipts(read_receipt(write_forged(value, tmp_path / name)), read_receipt(genuine()))["verdict"]
    except CheckpointError as exc:
        return f"refused: {exc}"


def test_forgeries_a_reviewer_found_are_refused_or_differ(tmp_path):
    """Found by an adversarial review of the ledger: each was bit-identical or losses-only before."""
    base = receipt_value(genuine())
    cut = json.loads(json.dumps(base))  # the run cut to 126 steps, the epochs claiming 63 steps each
    cut["trace"]["steps"] = 126
    set_losses(cut, losses(base)[:126])
    values = losses(cut)
    values.view(np.uint32)[5] ^= 1
    set_losses(cut, values)
    from forge import u32, u32_text

    cut["trace"]["fingerprint_u32_le_base64"] = u32_text(u32(base["trace"]["fingerprint_u32_le_base64"])[:126])
    cut["trace"]["boundaries"] = [b for b in base["trace"]["boundaries"] if b[0] <= 126]
    cut["position"]["global_step"], cut["sessions"][-1]["to_step"] = 126, 126
    cut["epochs"][0]["global_step"], cut["epochs"][1]["global_step"] = 63, 126
    assert verdict_of(cut, tmp_path, "cut") == "differs"

    shadowed = json.loads(json.dumps(base))
    shadowed["config"]["optimizer"]["lr"] = 0.02
    shadowed["config"]["optimizer.lr"] = base["config"]["optimizer"]["lr"]
    assert "which is not a config key name" in verdict_of(shadowed, tmp_path, "shadowed")

    for place in ((), ("trace",), ("position",)):
        extra = json.loads(json.dumps(base))
        (extra if not place else extra[place[0]])["results"] = {"test_accuracy": 0.99}
        assert "not a key of a receipt" in verdict_of(extra, tmp_path, f"extra-{len(place)}")
    extra = json.loads(json.dumps(base))
    extra["epochs"][0]["test_accuracy_top5"] = 0.99
    assert "not a key of an epoch record" in verdict_of(extra, tmp_path, "extra-epoch")

    fewer = json.loads(json.dumps(base))
    drop_fingerprints(fewer)
    assert verdict_of(fewer, tmp_path, "fewer") == "differs"
    shorter = json.loads(json.dumps(base))
    width = len(shorter["trace"]["tensor_names"])
    shorter["trace"]["tensor_fingerprint_steps"] = 32
    rows = u32(base["trace"]["tensor_fingerprint_u32_le_base64"])[: 32 * width]
    shorter["trace"]["tensor_fingerprint_u32_le_base64"] = u32_text(rows)
    assert verdict_of(shorter, tmp_path, "shorter") == "differs"

    for key, value in (("deterministic", 1), ("threads", 2.0)):  # equal in Python, not in the config's hash
        loose = json.loads(json.dumps(base))
        loose["config"][key] = value
        assert verdict_of(loose, tmp_path, f"loose-{key}") == "differs", key

    newline = json.loads(json.dumps(base))
    newline["trace"]["boundaries"][1][1][0] += "\n"
    assert verdict_of(newline, tmp_path, "newline").startswith("refused")
