"""`reprocube bench` on the generated dataset: the figures it promises are measured (in fresh processes)
and reported, the derived ratios follow from them, and bad input is refused in one line."""

from __future__ import annotations

import json

import pytest

from reprocube.results.bench_result import FIGURES as ALL_FIGURES

from helpers import error_lines, reprocube

pytestmark = pytest.mark.process  # every test here starts a process: not in make test-quick

FIGURES = tuple(f for f in ALL_FIGURES if f != "peak_gpu_mb")  # no GPU here


@pytest.fixture(scope="module")
def pytorch_bench(generated, tmp_path_factory):
    """Both determinism settings, 2 repeats, verify's cost over 1 epoch, and a reference file."""
    out = tmp_path_factory.mktemp("bench")
    reference = out / "reference.json"
    epochs = {
        "train_epoch_s": [9.0, 3.0, 6.0],
        "median_train_s_after_first_epoch": None,
        "threads": "2",
    }  # as reference_tutorial.py writes
    reference.write_text(json.dumps({"date": "2026-11-01", "batch_size_train": 32, "results": {"pytorch": epochs}}))
    proc = reprocube(
        "bench",
        "framework=pytorch",
        *generated.overrides(),
        "bench.repeats=2",
        "bench.verify_epochs=[1]",
        f"bench.reference={reference}",
        f"bench.out={out}",
        cwd=out,
        timeout=600,
    )
    return proc, json.loads((out / "bench.json").read_text()), (out / "bench.md").read_text()


def test_bench_measures_every_figure_in_fresh_processes(pytorch_bench):
    _, results, _ = pytorch_bench
    entry = results["frameworks"]["pytorch"]
    assert [r["deterministic"] for r in entry["runs"]] == [True, False, True, False]  # alternating, against drift
    for run in entry["runs"]:
        assert all(run[figure] > 0 for figure in FIGURES), run
        assert run["steps"] == 21 and run["batch_size"] == 32  # 650 examples: the whole epoch is timed
        assert run["samples_per_s"] == pytest.approx(650 / run["epoch_s"])
    assert len({run["pid"] for run in entry["runs"]}) == 4  # each measurement in its own process
    for mode in ("on", "off"):
        epoch = entry["summary"][mode]["epoch_s"]
        values = [r["epoch_s"] for r in entry["runs"] if r["deterministic"] == (mode == "on")]
        assert (epoch["min"], epoch["max"], epoch["n"]) == (min(values), max(values), 2)


def test_bench_derives_costs_and_reference_ratios_from_its_medians(pytorch_bench):
    _, results, markdown = pytorch_bench
    entry = results["frameworks"]["pytorch"]
    on, off = entry["summary"]["on"], entry["summary"]["off"]
    derived = entry["derived"]
    assert derived["determinism_cost"] == pytest.approx(on["epoch_s"]["median"] / off["epoch_s"]["median"] - 1)
    assert derived["checkpoint_share_of_epoch"] == pytest.approx(
        on["checkpoint_write_s"]["median"] / on["epoch_s"]["median"]
    )
    (verify,) = entry["verify"]
    assert verify["epochs"] == 1 and verify["verify_s"] > verify["train_s"] > 0  # verify trains several runs
    assert verify["verify_s"] > verify["verify_reused_s"] > 0  # run=PATH: no reference to train
    ratio = results["reference"]["frameworks"]["pytorch"]
    assert ratio["reference_epoch_s"] == 6.0  # the median of the reference's epochs
    assert ratio["speedup"] == pytest.approx(6.0 / on["epoch_s"]["median"])
    assert "| pytorch | on |" in markdown and "| pytorch | off |" in markdown
    assert f"| pytorch | 6.00 | 2 | {on['epoch_s']['median']:.2f} | {ratio['speedup']:.2f}x |" in markdown
    assert results["machine"]["cpu"]["count"] >= 1 and "torch" in results["machine"]["packages"]


@pytest.mark.parametrize("framework", ["tensorflow", "jax"])
def test_bench_runs_for_the_other_frameworks(generated, tmp_path, framework):
    reprocube(
        "bench",
        f"framework={framework}",
        *generated.overrides(),
        "bench.repeats=1",
        "bench.deterministic=[true]",
        "bench.verify_epochs=[]",
        f"bench.out={tmp_path}",
        cwd=tmp_path,
        timeout=600,
    )
    results = json.loads((tmp_path / "bench.json").read_text())
    (run,) = results["frameworks"][framework]["runs"]
    assert run["framework"] == framework and all(run[figure] > 0 for figure in FIGURES)
    assert (
        "verify" not in results["frameworks"][framework]
        and "determinism_cost" not in results["frameworks"][framework]["derived"]
    )


@pytest.mark.parametrize(
    "override, message",
    [
        ("bench.repeats=0", "reprocube: error: bench.repeats must be an integer >= 1, got 0"),
        (
            "bench.deterministic=[true,true]",
            (
                "reprocube: error: bench.deterministic must be a list of distinct true/false values, "
                "e.g. [true,false], got [True, True]"
            ),
        ),
        ("framework=caffe", "reprocube: error: framework must be all or one of pytorch, tensorflow, jax, got 'caffe'"),
    ],
)
def test_bench_refuses_bad_settings_in_one_line(tmp_path, override, message):
    proc = reprocube("bench", override, f"bench.out={tmp_path}/out", cwd=tmp_path, check=False)
    assert proc.returncode == 2
    assert error_lines(proc) == [message]
    assert not (tmp_path / "out").exists()


def test_bench_names_an_unreadable_reference(generated, tmp_path):
    proc = reprocube(
        "bench",
        "framework=pytorch",
        *generated.overrides(),
        "bench.repeats=1",
        "bench.deterministic=[true]",
        "bench.verify_epochs=[]",
        f"bench.reference={tmp_path}/absent.json",
        f"bench.out={tmp_path}/out",
        cwd=tmp_path,
        check=False,
    )
    assert proc.returncode == 2
    assert error_lines(proc) == [f"reprocube: error: bench.reference: {tmp_path}/absent.json is missing"]
    assert not (tmp_path / "out").exists()
