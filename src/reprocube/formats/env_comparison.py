"""Which differences between two environments (env.json, a receipt's env) most likely explain a
numerical divergence: a ranked list, with the differences known not to change the numbers last."""

from __future__ import annotations

from reprocube.config import flatten_keys

# env.json keys, most likely first to explain a divergence (a prefix match on the flattened key).
ENV_RELEVANCE = (
    "framework.name",
    "framework.device",
    "framework.backend",
    "framework.gpu",
    "framework.torch",
    "framework.tensorflow",
    "framework.keras",
    "framework.jax",
    "framework.jaxlib",
    "framework.cuda",
    "framework.cudnn",
    "framework.driver",
    "framework.cublas",
    "framework.tf32",
    "framework.float32_matmul_precision",
    "framework.default_matmul_precision",
    "framework.deterministic",
    "framework.op_determinism",
    "framework.cudnn_deterministic",
    "framework.xla_flags",
    "framework.prng_impl",
    "framework.threefry",
    "framework.num_threads",
    "framework.intra_op",
    "framework.inter_op",
    "framework.cpu_affinity",
    "framework.cpu_capability",
    "framework.onednn",
    "cpu.isa",
    "env_vars.ONEDNN_",
    "env_vars.DNNL_",
    "env_vars.ATEN_",
    "env_vars.XLA_FLAGS",
    "env_vars.MKL_",
    "env_vars.OMP_",
    "env_vars.KMP_",
    "env_vars.TF_",
    "env_vars.NVIDIA_TF32_OVERRIDE",
    "env_vars.CUBLAS_",
    "cpu.model",
    "cpu.affinity",
    "env_vars.XLA_",
    "env_vars.JAX_",
    "env_vars.KERAS_",
    "env_vars.CUDA_",
    "packages.",
    "container",
    "framework.",
    "python",
    "cpu.count",
    "machine",
    "platform",
    "hostname",
)
# The parts of an environment that set how numbers are computed (a session that resumed with other values
# of these computes its steps differently).
NUMERIC_SETTINGS = ("env_vars.", "framework.", "cpu.isa", "cpu.model", "packages.", "python")
# Differences known not to change these trainers' numbers, listed last with the reason.
NOT_NUMERIC = {
    "env_vars.PYTHONHASHSEED": "every generator is seeded explicitly; no computation iterates a hash-ordered set",
    "hostname": "a name",
    "framework.compilation_cache": "on the CPU a step loaded from JAX's cache is the one this machine compiles "
    "(bit-identical: tests/test_compilation_cache.py)",
}
# Of those, the ones that hold only where both ran on the CPU: on a GPU a cached step carries an earlier
# compilation's autotuning choices.
CPU_ONLY = {"framework.compilation_cache"}


def not_a_cause(key: str, backend_a, backend_b) -> str | None:
    """Why a difference in `key` does not change these numbers, or None."""
    if key in CPU_ONLY and not backend_a == backend_b == "cpu":
        return None
    return NOT_NUMERIC.get(key)


def env_differences(a: dict, b: dict) -> list[dict]:
    """Differing env.json entries, those most likely to explain a divergence first."""
    fa, fb = flatten_keys(a), flatten_keys(b)
    missing = "<absent>"
    rows = [
        {"key": k, "a": fa.get(k, missing), "b": fb.get(k, missing)}
        for k in set(fa) | set(fb)
        if fa.get(k, missing) != fb.get(k, missing)
    ]
    for row in rows:
        reason = not_a_cause(row["key"], fa.get("framework.backend"), fb.get("framework.backend"))
        if reason:
            row["not_a_cause"] = reason

    def rank(row):
        if "not_a_cause" in row:
            return len(ENV_RELEVANCE) + 1, row["key"]
        return next(
            (i for i, prefix in enumerate(ENV_RELEVANCE) if row["key"].startswith(prefix)), len(ENV_RELEVANCE)
        ), row["key"]

    return sorted(rows, key=rank)
