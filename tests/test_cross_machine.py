"""A real second machine (issue 37): machines of this project's kind are AMD EPYC with AVX-512 or with
AVX2 only, and their CPU kernels give different bits. Each kind's reference receipts are committed under
tests/receipts/<isa>/<framework>/ (scripts/make-reference-receipts.sh, signed; the public key beside
them), and every one is reproduced here, from the receipt alone, as a user would:

- a receipt of this machine's kind reproduces bit for bit, every claim compared (established on the
  AVX-512 machine: all three frameworks, benchmarks/cross-machine.md);
- a receipt of the other kind: on an AVX2 machine, an AVX-512 receipt cannot be emulated, and wherever
  it differs the answer names the ISA among the causes and says this CPU lacks A's instructions; on an
  AVX-512 machine, an AVX2 receipt is reproduced with --match, which retrains it on QEMU's model of the
  AVX2 machine's CPU (reprocube.runtime.cpu_emulation) and must give A's bits: that model gives the AVX2 machine's
  recorded digests for all three frameworks (tests/test_cpu_emulation.py). Without QEMU, --match sets
  the ISA caps, which give them for TensorFlow and PyTorch (contiguous), not for JAX
  (tests/test_golden_digests.py): then the answer is bit for bit or names the first differing update.
  No AVX2 receipt is committed yet (benchmarks/cross-machine.md says which rows wait for which machine).
- A kind with no receipt committed is skipped, naming what is missing and how to make it.

The committed receipts are also fixtures every later reprocube must still read and reproduce."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reprocube.formats.env import collect_env
from reprocube.runtime.cpu_emulation import emulator_path
from reprocube.training.backend import FRAMEWORKS

from helpers import reprocube

pytestmark = pytest.mark.process  # every test here starts a process: not in make test-quick

RECEIPTS = Path(__file__).parent / "receipts"
ISAS = ("avx512", "avx2")


def this_isa() -> str:
    return "avx512" if "avx512f" in collect_env({})["cpu"]["isa"] else "avx2"


@pytest.mark.slow
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_reference_receipt_reproduces_here_as_established(isa, framework, fashion_mnist, tmp_path):
    receipt = RECEIPTS / isa / framework
    if not (receipt / "receipt.json").is_file():
        pytest.skip(
            f"no receipt of an {isa} machine committed for {framework} ({receipt}): make it with "
            f"scripts/make-reference-receipts.sh on an {isa} machine"
        )
    proc = reprocube(
        "reproduce",
        str(receipt),
        "--match",
        "--public-key",
        str(RECEIPTS / isa / "signing-key.pub"),
        "--out",
        str(tmp_path / "out"),
        f"data_dir={fashion_mnist}",
        cwd=tmp_path,
        check=False,
        timeout=600,
    )
    assert proc.returncode in (0, 6, 7), proc.stderr
    result = json.loads((tmp_path / "out" / "reproduce.json").read_text())
    assert result["signature"]["verified"] is True
    here = this_isa()
    if isa == here:
        assert result["verdict"] == "bit-identical" and proc.returncode == 0, result["summary"]
        assert result["claims"]["totals"]["not_checked"] == 0 and result["claims"]["totals"]["differs"] == 0
        return
    if result["verdict"] == "bit-identical":
        return  # this framework's kernels agree on both kinds: nothing to explain
    keys = [cause["key"] for cause in result["causes"] if cause["kind"] == "environment"]
    assert any(key.startswith("env.cpu.isa") for key in keys), keys
    if here == "avx2":  # A's AVX-512 kernels cannot run here
        assert any("which this CPU lacks" in line and "avx512f" in line for line in result["match"]["cannot"])
    elif emulator_path() is not None:  # A's CPU emulated: A's bits, as the golden digests established
        assert result["match"]["bit_identical"] is True and result["match"]["cpu"], result["match"]["summary"]
    else:  # the caps: bit for bit, or the first differing update named
        assert result["match"]["ran"] is True, result["match"]
        if not result["match"]["bit_identical"]:
            assert result["first_divergence"]["step"] >= 1 and result["first_divergence"]["tensors"] is not None
