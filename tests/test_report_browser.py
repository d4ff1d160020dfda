"""report.html of a reproduction, opened in a real browser (headless Chromium): A is a small PyTorch run,
B its reproduction here, once as it is (bit-identical) and once with ATEN_CPU_CAPABILITY=default (which
really changes PyTorch's CPU kernels here: B differs). The rendered page must show the verdict, the
summary and the top cause, and every embedded image must decode; `reprocube report` renders a reproduce
directory with the same sections and refuses a malformed reproduce.json in one line."""

from __future__ import annotations

import base64
import html
import io
import json
import re
import shutil
import subprocess
from pathlib import Path

import matplotlib.image
import pytest

from reprocube.commands.reproduce import reproduce
from reprocube.pages.runs_page import write_report

from helpers import error_lines, reprocube

pytestmark = pytest.mark.process  # every test here starts a process: not in make test-quick

SMALL = ["framework=pytorch", "epochs=2", "log.every_steps=5", "trace.every_steps=5"]
CHROMIUM = shutil.which("chromium")
DATA_URL = re.compile(r"src='data:image/png;base64,([A-Za-z0-9+/=]+)'")
# Appended to a copy of the page: after load, the title counts the images the browser decoded.
COUNT_DECODED = (
    "<script>window.addEventListener('load', () => { const images = [...document.images];"
    " document.title = 'decoded ' + images.filter(i => i.complete && i.naturalWidth > 0).length"
    " + '/' + images.length; });</script>"
)


def quiet(_line: str) -> None:
    pass


@pytest.fixture(scope="module")
def reproductions(generated, tmp_path_factory):
    """(A's run, the bit-identical reproduce directory, the differing one: with 2 seed runs, a box plot)."""
    root = tmp_path_factory.mktemp("report-browser")
    reprocube("train", *generated.overrides(), *SMALL, f"output_dir={root / 'a'}", "run_name=a", cwd=root)
    a = root / "a" / "a"
    place = [f"data_dir={generated.data_dir}"]
    reproduce(a, root / "same", place, echo=quiet)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ATEN_CPU_CAPABILITY", "default")
        reproduce(a, root / "differs", place, seeds=2, echo=quiet)
    return a, root / "same", root / "differs"


def chromium(*args: str, profile: Path) -> str:
    if CHROMIUM is None:
        pytest.skip("chromium is not installed (make system-packages installs it)")
    proc = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={profile}", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def decode_images(page: str) -> list[tuple[int, int]]:
    """(height, width) of every embedded PNG, decoded."""
    shapes = []
    for encoded in DATA_URL.findall(page):
        image = matplotlib.image.imread(io.BytesIO(base64.b64decode(encoded, validate=True)), format="png")
        shapes.append(image.shape[:2])
    return shapes


def rendered(page_path: Path, tmp_path: Path) -> tuple[str, str, str]:
    """(the DOM Chromium renders from the page, its text, the 'decoded N/M' title of a copy that counts
    the images it decoded)."""
    dom = chromium("--dump-dom", page_path.resolve().as_uri(), profile=tmp_path / "profile")
    counted = tmp_path / "counted.html"
    counted.write_text(page_path.read_text().replace("</body>", COUNT_DECODED + "</body>"))
    counting = chromium("--virtual-time-budget=5000", "--dump-dom", counted.as_uri(), profile=tmp_path / "profile")
    title = re.search(r"<title>(.*?)</title>", counting)
    text = html.unescape(re.sub(r"<[^>]*>", "", dom))
    return html.unescape(dom), text, title.group(1) if title else ""


@pytest.mark.parametrize("which", ["same", "differs"])
def test_reproduce_writes_a_report_that_a_browser_renders(reproductions, which, tmp_path):
    out = reproductions[1 if which == "same" else 2]
    result = json.loads((out / "reproduce.json").read_text())
    assert result["verdict"] == ("bit-identical" if which == "same" else "differs"), result["summary"]
    page = (out / "report.html").read_text()
    shapes = decode_images(page)
    expected = {"difference.png", "divergence-map.png"} | ({"seed-spread.png"} if which == "differs" else set())
    assert len(shapes) == len(expected) and all(h > 100 and w > 100 for h, w in shapes)
    assert {p.name for p in out.glob("*.png")} == expected

    dom, text, title = rendered(out / "report.html", tmp_path)
    assert title == f"decoded {len(expected)}/{len(expected)}"
    assert f"Verdict: {result['verdict']}" in text and result["summary"] in text and result["tier_text"] in text
    if which == "same":
        return
    assert "env.env_vars.ATEN_CPU_CAPABILITY" in [c["key"] for c in result["causes"]]
    top = next(c for c in result["causes"] if c["kind"] != "not-numeric")
    # The verdict, the summary and the causes table come before the plots.
    assert dom.index(result["summary"]) < dom.index(f"<code>{top['key']}</code></td>") < dom.index("<img")
    assert f"First divergence: global step {result['first_divergence']['step']}" in text


def test_report_renders_a_reproduce_directory_with_the_same_sections(reproductions, tmp_path):
    a, _, differs = reproductions
    alone = write_report([differs / "reproduce.json"], tmp_path / "alone")
    page = alone.read_text()
    assert page == (differs / "report.html").read_text()  # the page reproduce itself wrote
    mixed = write_report([differs, a], tmp_path / "mixed").read_text()
    assert len(decode_images(mixed)) == 3 + 1  # the reproduction's three, and the run's curves
    assert mixed.index("Verdict: ") < mixed.index("<h2>Curves</h2>")
    assert {p.name for p in (tmp_path / "mixed").glob("*.png")} == {
        "curves.png",
        "reproduce-1-difference.png",
        "reproduce-1-divergence-map.png",
        "reproduce-1-seed-spread.png",
    }
    _, text, title = rendered(tmp_path / "mixed" / "report.html", tmp_path)
    assert title == "decoded 4/4" and "Environment differences" in text


def _set(path: list, value):
    def change(result: dict) -> None:
        target = result
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    return change


@pytest.mark.parametrize(
    "change, message",
    [
        (_set(["verdict"], "maybe"), "verdict must be one of bit-identical, losses-only, differs"),
        (_set(["causes", 0, "kind"], 5), "causes[0]: kind must be a string"),
        (_set(["first_divergence", "step"], "4"), "first_divergence: step must be an integer"),
        (_set(["seed_spread", "test_accuracy", "values"], ["x"]), "values must be a list of finite numbers"),
        (_set(["coverage"], None), "coverage must be a JSON object"),
        (_set(["source_sha256"], "0" * 64), "is not the receipt reproduced"),
        (_set(["run_b"], "/nonexistent/b"), "run_b must be 'runs/b'"),  # never a path from the file
    ],
)
def test_report_refuses_a_malformed_reproduce_json_in_one_line(reproductions, tmp_path, change, message):
    differs = reproductions[2]
    copy = tmp_path / "copy"
    shutil.copytree(differs, copy, ignore=shutil.ignore_patterns("*.png", "report.html"))
    result = json.loads((copy / "reproduce.json").read_text())
    change(result)
    (copy / "reproduce.json").write_text(json.dumps(result))
    proc = reprocube("report", str(copy), "--out", str(tmp_path / "out"), cwd=tmp_path, check=False)
    if message is None:
        assert proc.returncode == 0, proc.stderr
        return
    [line] = error_lines(proc)
    assert proc.returncode == 4 and "Traceback" not in proc.stderr
    assert str(copy / "reproduce.json") in line and message in line, line
    assert not (tmp_path / "out" / "report.html").exists()


# Where the verdict line and the next step sit on a laptop's screen (1366x768, the viewport's CSS pixels).
MEASURE_FOLD = (
    "<script>window.addEventListener('load', () => { const bottom = s => Math.round("
    "document.querySelector(s).getBoundingClientRect().bottom); document.title = 'fold ' + window.innerHeight"
    " + ' verdict ' + bottom('p.headline') + ' todo ' + bottom('p.headline ~ h2 + p'); });</script>"
)


def test_the_verdict_line_and_what_to_do_are_above_the_fold(reproductions, tmp_path):
    """Issue 39: the answer in two seconds. In the differing reproduction, the one-line verdict (what, how
    big, does it matter) and the first line of "What to do" are inside a laptop's first screen."""
    out = reproductions[2]
    result = json.loads((out / "reproduce.json").read_text())
    page = (out / "report.html").read_text()
    measured = tmp_path / "measured.html"
    measured.write_text(page.replace("</body>", MEASURE_FOLD + "</body>"))
    dom = chromium(
        "--window-size=1366,768",
        "--virtual-time-budget=5000",
        "--dump-dom",
        measured.as_uri(),
        profile=tmp_path / "profile",
    )
    fold, verdict, todo = map(int, re.search(r"<title>fold (\d+) verdict (\d+) todo (\d+)</title>", dom).groups())
    assert 0 < verdict < todo <= fold, (fold, verdict, todo)
    text = html.unescape(re.sub(r"<[^>]*>", "", dom))
    # Here ATEN_CPU_CAPABILITY=default already computes the initialisation differently: said so, never
    # "update 1" (the first differing loss is step 1's, computed from weights that differed before it).
    assert result["first_divergence"]["initial_tensors"], result["first_divergence"]
    assert "B differs from A from the start (the initial weights already differ)" in text
    assert "The initial weights already differ, before any update: tensors conv1.bias" in text
    assert "most likely cause env.framework.cpu_capability" in text
    assert "Find out whether this machine can give A's bits" in text  # no --match: the command that finds out
