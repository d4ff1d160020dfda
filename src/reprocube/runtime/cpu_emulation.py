"""Another machine's CPU, emulated: qemu-x86_64 in user mode runs one process on one of QEMU's CPU models.
Every kernel library (oneDNN, MKL, ATen, XLA's LLVM) reads that model's CPUID and picks the kernels it
picks on such a CPU, and QEMU computes their instructions in software, rounded as IEEE 754 says.

Checked against the real AVX2 machine's recorded digests (tests/test_golden_digests.py): on an AVX-512
machine, EPYC-Milan-v1 (AMD, AVX2, no AVX-512) gives them bit for bit for all three frameworks, where the
ISA caps (analysis.match_plan.AVX2_CAPS) do not for JAX (benchmarks/cross-machine.md). QEMU 7.2 emulates
no AVX-512: no model presents an AVX-512 CPU. An emulated process runs 10-30x slower, and a process it
starts runs natively (qemu-user does not follow exec), so only a training process itself is wrapped."""

from __future__ import annotations

import shutil

from reprocube.errors import ConfigError

EMULATOR = "qemu-x86_64"
INSTALL_HINT = "apt-get install qemu-user"
# The start of --match's `cannot` line where QEMU would emulate A's CPU but is not installed: this machine
# could give A's bits (reproduce_wording.what_to_do says how), not "a machine with A's setting".
NOT_INSTALLED = f"A's CPU exactly without {EMULATOR}"
# QEMU's models checked to give a real machine's bits: the model, its vendor as /proc/cpuinfo names it, and
# the ISA flags (env.ISA_FLAGS) that machine had. Only these are used: a model gives a machine's bits
# only where its libraries choose as they do there, which a digest comparison has to show.
CHECKED_MODELS = (("EPYC-Milan-v1", "AMD", ("sse4_2", "avx", "avx2", "fma")),)


def emulator_path() -> str | None:
    """The emulator's absolute path, or None where it is not installed."""
    return shutil.which(EMULATOR)


def model_for(a_cpu: object, b_isa: list[str]) -> str | None:
    """The checked model that presents A's CPU (a receipt's env.cpu) on a machine with `b_isa`, or None:
    A's CPU must have exactly a checked model's ISA flags and vendor, and this CPU every one of them."""
    if not isinstance(a_cpu, dict) or not isinstance(a_cpu.get("isa"), list):
        return None
    a_isa, a_model = tuple(a_cpu["isa"]), a_cpu.get("model")
    for model, vendor, isa in CHECKED_MODELS:
        if a_isa == isa and isinstance(a_model, str) and a_model.startswith(vendor) and set(isa) <= set(b_isa):
            return model
    return None


def emulated_command(command: list[str], model: str) -> list[str]:
    """`command` (its first element the Python interpreter's absolute path) run on the emulated CPU."""
    path = emulator_path()
    if path is None:  # it was when --match planned: removed since
        raise ConfigError(f"{EMULATOR} is no longer installed ({INSTALL_HINT}): cannot emulate A's CPU")
    return [path, "-cpu", model, *command]
