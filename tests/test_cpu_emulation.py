"""The AVX2 machine's CPU, emulated (reprocube.runtime.cpu_emulation): QEMU's EPYC-Milan-v1 model, trained on any
x86 machine, against the digests the real AVX2 machine recorded (tests/golden_digests.json), and
`reproduce --match` retraining an AVX2 run on that model where this machine has AVX-512.

Established 2026-11-26 on an AVX-512 machine: the model gives the AVX2 machine's digests bit for bit for
all three frameworks, JAX included, where the ISA caps do not give JAX's (benchmarks/cross-machine.md)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from reprocube.analysis.match_plan import AVX2_CAPS, match_plan, session_settings
from reprocube.formats.env import MASKED_NOTE, collect_env
from reprocube.orchestration.reproduce_reruns import match_recipe
from reprocube.results.reproduce_wording import what_to_do
from reprocube.runtime.cpu_emulation import (
    CHECKED_MODELS,
    EMULATOR,
    INSTALL_HINT,
    NOT_INSTALLED,
    emulator_path,
    model_for,
)
from test_golden_digests import AWAITING_RECORD, GOLDEN, VARIANTS, machine_key, train_digest

from helpers import reprocube

MODEL, VENDOR, AVX2_ISA = CHECKED_MODELS[0]
AVX512_ISA = [*AVX2_ISA, "avx512f", "avx512bw", "avx512vl", "avx512_bf16", "avx512_vnni"]
AVX2_AMD = {"model": "AMD EPYC", "isa": list(AVX2_ISA), "count": 2, "affinity": 2}


def need_emulator() -> None:
    """Skip where QEMU is not installed, except under make test (it installs QEMU): fail there."""
    if emulator_path() is None:
        message = f"{EMULATOR} is not installed (apt-get install qemu-user; make test installs it)"
        if os.environ.get("REPROCUBE_REQUIRE_GOLDEN"):
            pytest.fail(message)
        pytest.skip(message)


def test_only_a_checked_model_presents_a_cpu():
    assert model_for(AVX2_AMD, AVX512_ISA) == MODEL
    assert model_for(AVX2_AMD, list(AVX2_ISA)) == MODEL  # an AVX2 machine: the same kernels as natively
    assert model_for({**AVX2_AMD, "model": "Intel(R) Xeon(R) CPU"}, AVX512_ISA) is None  # not checked
    assert model_for({**AVX2_AMD, "isa": AVX512_ISA}, AVX512_ISA) is None  # QEMU has no AVX-512
    assert model_for({**AVX2_AMD, "isa": ["sse4_2", "avx", "avx2"]}, AVX512_ISA) is None  # no fma: another CPU
    assert model_for(AVX2_AMD, ["sse4_2", "avx"]) is None  # this CPU lacks A's instructions
    for forged in (None, "AMD", {"isa": "avx2"}, {"isa": list(AVX2_ISA), "model": 3}, {"isa": [1, 2]}):
        assert model_for(forged, AVX512_ISA) is None


def _plan(a_cpu: dict, b_isa: list[str], emulator: bool) -> dict:
    session = {"from_step": 0, "to_step": 10, "env": {"cpu": a_cpu, "env_vars": {}}}
    a = SimpleNamespace(sessions=[session])
    b = SimpleNamespace(env={"cpu": {**AVX2_AMD, "isa": b_isa}, "env_vars": {}})
    return match_plan(a, b, [], emulator=emulator)


def test_match_emulates_an_avx2_cpu_where_qemu_is_installed_and_caps_it_otherwise():
    plan = _plan(AVX2_AMD, AVX512_ISA, emulator=True)
    assert plan["cpu"] == MODEL and plan["settings"] == {} and plan["cannot"] == []
    plan = _plan(AVX2_AMD, AVX512_ISA, emulator=False)
    assert plan["cpu"] is None and plan["settings"] == AVX2_CAPS
    assert any(EMULATOR in line and "not for JAX" in line for line in plan["cannot"]), plan["cannot"]
    plan = _plan({**AVX2_AMD, "model": "Intel(R) Core(TM) i7"}, AVX512_ISA, emulator=True)  # no checked model
    assert plan["cpu"] is None and plan["settings"] == AVX2_CAPS and plan["cannot"] == []
    plan = _plan(AVX2_AMD, list(AVX2_ISA), emulator=True)  # the same ISA: nothing to emulate
    assert plan["cpu"] is None and plan["settings"] == {}
    b_env = {"cpu": {**AVX2_AMD, "isa": AVX512_ISA}, "env_vars": {}}
    plan = session_settings({"cpu": AVX2_AMD, "env_vars": {}}, b_env)  # a script's command: never emulated
    assert plan["cpu"] is None and plan["settings"] == AVX2_CAPS
    assert any("script" in line and "not for JAX" in line for line in plan["cannot"]), plan["cannot"]


def test_the_answer_without_qemu_says_how_this_machine_would_give_as_bits():
    """Where the caps did not give A's bits but QEMU would emulate A's CPU, the next step is to install it
    here, not "a machine with A's setting"."""
    match = {
        "bit_identical": False,
        "recipe": None,
        "summary": "with ONEDNN_MAX_CPU_ISA=AVX2, B still differs (first at step 1)",
        "cannot": [f"{NOT_INSTALLED} ({INSTALL_HINT}); the ISA caps set instead ...", "config differences (seed)"],
    }
    result = {"verdict": "differs", "tier": "within-ulp", "source": "runs/a b", "match": match}
    lines = what_to_do(result)
    assert INSTALL_HINT in lines[0] and "reprocube reproduce 'runs/a b' --match" in lines[0], lines
    assert not any(NOT_INSTALLED in line for line in lines) and "cannot give" not in lines[0]
    assert lines[1] == "It cannot emulate config differences (seed): a machine with A's setting can."


def test_a_recipe_that_emulates_any_step_names_one_interpreter_for_every_command():
    segments = [
        {"settings": {}, "cpu": MODEL, "from_step": 0, "to_step": 3},
        {"settings": {"OMP_NUM_THREADS": "1"}, "cpu": None, "from_step": 3, "to_step": 6},
    ]
    match = {"settings": {}, "cpu": MODEL, "segments": segments}
    first, second = match_recipe(match, ["framework=pytorch"], None)
    python = [sys.executable, "-P", "-m", "reprocube", "train"]
    assert first["argv"][:8] == [EMULATOR, "-cpu", MODEL, *python] and second["argv"][:5] == python
    assert second["env"] == {"OMP_NUM_THREADS": "1"} and "resume=latest" in second["argv"]
    plain = match_recipe({"settings": {"OMP_NUM_THREADS": "1"}, "cpu": None, "segments": None}, [], None)
    assert plain[0]["argv"][:2] == ["reprocube", "train"]


@pytest.mark.process
@pytest.mark.slow
@pytest.mark.parametrize("variant", VARIANTS)
def test_the_emulated_cpu_gives_the_avx2_machines_recorded_digest(fashion_mnist, tmp_path, variant):
    """The proof that --match may stand in QEMU's model for the real AVX2 machine: its digest, recorded
    there, computed here on the model (on an AVX2 machine too: there it must equal the native one)."""
    need_emulator()
    key = machine_key(VARIANTS[variant][0], list(AVX2_ISA))
    recorded = json.loads(GOLDEN.read_text()).get(variant, {})
    if key not in recorded:
        awaiting = AWAITING_RECORD.get((variant, "avx2"), "")
        pytest.skip(f"no AVX2 machine's digest recorded for {variant} on {key}: {awaiting}")
    (tmp_path / "data").symlink_to(fashion_mnist)
    assert train_digest(tmp_path, variant, cpu=MODEL) == recorded[key]


def _avx512_machine() -> bool:
    return "avx512f" in collect_env({})["cpu"]["isa"]


@pytest.mark.process
@pytest.mark.slow
def test_reproduce_match_retrains_an_avx2_run_on_the_emulated_cpu(fashion_mnist, tmp_path):
    """A run made on the emulated AVX2 CPU, reproduced here as a user would: on an AVX-512 machine B
    differs, --match retrains it on the model and gets A's bits, the first differing operation is replayed
    on it, and the recipe it gives, run again, gives A's final digest; on an AVX2 machine B is A."""
    need_emulator()
    config = ("framework=pytorch", "dataset=fashion_mnist", "data.train_limit=192", "data.test_limit=64", "epochs=1")
    reprocube("train", *config, f"data_dir={fashion_mnist}", "run_name=a", cwd=tmp_path, cpu=MODEL, timeout=600)
    a = json.loads((tmp_path / "runs" / "a" / "receipt.json").read_text())
    assert a["env"]["cpu"]["isa"] == list(AVX2_ISA)  # what the process's CPUID offered, not /proc/cpuinfo
    if _avx512_machine():  # /proc/cpuinfo names this machine's CPU: the record says it is not what ran
        assert a["env"]["cpu"]["model"].endswith(f"({MASKED_NOTE})"), a["env"]["cpu"]
    out = tmp_path / "out"
    proc = reprocube(
        "reproduce",
        "runs/a",
        "--match",
        "--out",
        str(out),
        f"data_dir={fashion_mnist}",
        cwd=tmp_path,
        check=False,
        timeout=900,
    )
    result = json.loads((out / "reproduce.json").read_text())
    if not _avx512_machine():
        assert result["verdict"] == "bit-identical" and proc.returncode == 0, result["summary"]
        return
    assert result["verdict"] != "bit-identical", result["summary"]
    match = result["match"]
    assert match["bit_identical"] is True and match["cpu"] == MODEL, match
    assert f"A's CPU emulated ({EMULATOR} -cpu {MODEL})" in match["summary"]
    assert result["first_operation"]["status"] == "found", result["first_operation"]
    (command,) = match["recipe"]
    assert command["argv"][:3] == [EMULATOR, "-cpu", MODEL] and command["env"] == {}
    recipe = tmp_path / "recipe"
    recipe.mkdir()
    argv = [*command["argv"][3:], f"data_dir={fashion_mnist}"]  # the interpreter on, as the recipe has it
    assert argv[:4] == [argv[0], "-P", "-m", "reprocube"] and Path(argv[0]).is_absolute()
    reprocube(*argv[4:], cwd=recipe, cpu=MODEL, timeout=600)
    manifest = recipe / "runs" / "a-bits" / "checkpoints" / "epoch-0001" / "manifest.json"
    final = json.loads((tmp_path / "runs" / "a" / "checkpoints" / "epoch-0001" / "manifest.json").read_text())
    assert json.loads(manifest.read_text())["weights_digest"] == final["weights_digest"]
