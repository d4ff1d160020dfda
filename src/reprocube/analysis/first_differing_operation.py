"""The first operation that computes differently: two recordings of one step (OPS.json, written by
`python -m reprocube.orchestration.replay_step`, reprocube.training.replay) compared operation by operation.

Pure: no framework is imported. An operation is compared by its name, its non-tensor arguments
("params", a digest), the digest of each input tensor before it ran and of each output after. The first
operation where anything differs is the answer:
- inputs and arguments equal, an output differs: this operation computes differently here (a kernel, an
  instruction set, a thread split); a random operation's output differs when its generator state does;
- an input differs (every earlier output being equal): the state or data entering the step differs;
- the names differ, or one recording ends: the two runs took different operation sequences (another
  kernel path, another library version).
JAX's and TensorFlow's recordings hold the step's inputs and its kernels only (KERNELS_ONLY): an input
of a kernel that differs there means an unrecorded operation before it computed differently."""

from __future__ import annotations

from reprocube.formats.ops_format import STEP_INPUT

# JAX's and TensorFlow's recordings hold the step's inputs (one STEP_INPUT entry each) and its kernels only
# (convolutions, matrix products): recording every intermediate changes how the step is fused (XLA, oneDNN's graph
# rewrites).
KERNELS_ONLY = ("jax", "tensorflow")
RANDOM_OPS = ("bernoulli", "rand", "normal", "uniform", "exponential", "multinomial", "dropout", "random")


def operation_name(op: str) -> str:
    """`aten.convolution_backward.default` -> `convolution backward`."""
    parts = op.split(".")
    name = parts[1] if len(parts) >= 2 else op
    return name.strip("_").replace("_", " ") or op


def _describe(op: dict) -> str:
    return f"{operation_name(op['op'])} ({op['op']}) in {op['where']}"


def _differing(a: list[str], b: list[str]) -> list[int]:
    return [i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y] + list(
        range(min(len(a), len(b)), max(len(a), len(b)))
    )


def _listed(indices: list[int], total: int, noun: str) -> str:
    if total == 1:
        return noun
    shown = ", ".join(str(i) for i in indices[:5]) + (", ..." if len(indices) > 5 else "")
    return f"{noun} {shown} of {total}"


def first_differing_operation(a_ops: dict, b_ops: dict) -> dict | None:
    """The first operation at which recording B (OPS.json content, as read_ops returns it) departs from
    recording A, or None when every operation agrees (same names, arguments, inputs and outputs). Keys:
    index, kind ("output": inputs and arguments equal, an output differs; "inputs": an input differs;
    "params": the non-tensor arguments differ; "sequence": the operations themselves differ or one
    recording ends), op and where (A's; None where A has ended), b_op and b_where (B's), inputs_equal,
    params_equal, differing_inputs and differing_outputs (indices; [] for a sequence divergence),
    random (a random operation: its generator state is an input no digest covers), compared (operations
    compared before it) and text (one line). Raises ValueError for recordings of different steps or
    frameworks (not one step to compare)."""
    for key in ("framework", "step"):
        if a_ops.get(key) != b_ops.get(key):
            raise ValueError(f"the recordings are of different {key}s ({a_ops.get(key)} and {b_ops.get(key)})")
    a_list, b_list = a_ops["ops"], b_ops["ops"]
    for i, (x, y) in enumerate(zip(a_list, b_list, strict=False)):
        if x["op"] != y["op"] or len(x["inputs"]) != len(y["inputs"]) or len(x["outputs"]) != len(y["outputs"]):
            return _sequence(i, x, y)
        inputs, outputs = _differing(x["inputs"], y["inputs"]), _differing(x["outputs"], y["outputs"])
        params_equal = x["params"] == y["params"]
        if not (inputs or outputs or not params_equal):
            continue
        random = any(word in x["op"] for word in RANDOM_OPS)
        output_text = (
            f"{_listed(outputs, len(x['outputs']), 'output')} differ{'s' if len(outputs) == 1 else ''}"
            if outputs
            else "outputs equal"
        )
        if inputs and x["op"] == STEP_INPUT:
            kind = "inputs"
            initial = (
                " (the initial weights: the initialisation computed differently)"
                if (a_ops["step"] == 1 and ".params." in f".{x['where'].removeprefix('step input ')}")
                else ""
            )
            text = f"the state or data entering step {a_ops['step']} differs, first at {x['where']}{initial}"
            text += _earlier_steps(a_ops, b_ops)
        elif inputs and a_ops["framework"] in KERNELS_ONLY:
            kind = "inputs"
            text = (
                f"{_describe(x)}: {_listed(inputs, len(x['inputs']), 'input')} "
                f"differ{'s' if len(inputs) == 1 else ''}, "
                f"{output_text} (the step's inputs and every earlier kernel agree: an operation between them that "
                "is not recorded (elementwise or a reduction, fused with others in the compiled step) computes "
                "differently)"
            )
        elif inputs:
            kind = "inputs"
            text = (
                f"{_describe(x)}: {_listed(inputs, len(x['inputs']), 'input')} "
                f"differ{'s' if len(inputs) == 1 else ''}, "
                f"{output_text} (every earlier operation agrees: "
                f"the state or data entering step {a_ops['step']} differs" + _earlier_steps(a_ops, b_ops) + ")"
            )
        elif not params_equal:
            kind = "params"
            text = f"{_describe(x)}: inputs equal, non-tensor arguments differ, {output_text}"
        else:
            kind = "output"
            cause = " (a random operation: its generator state differs)" if random else ""
            text = f"{_describe(x)}: inputs equal, {output_text}{cause}"
        return {
            "index": i,
            "kind": kind,
            "op": x["op"],
            "where": x["where"],
            "b_op": y["op"],
            "b_where": y["where"],
            "inputs_equal": not inputs,
            "params_equal": params_equal,
            "differing_inputs": inputs,
            "differing_outputs": outputs,
            "random": random,
            "compared": i,
            "text": text,
        }
    if len(a_list) != len(b_list):
        i = min(len(a_list), len(b_list))
        return _sequence(i, a_list[i] if i < len(a_list) else None, b_list[i] if i < len(b_list) else None)
    return None


def _earlier_steps(a_ops: dict, b_ops: dict) -> str:
    """Where each replay trained steps of its own before step N, they may have diverged there."""
    start = min(a_ops.get("start_step", 0), b_ops.get("start_step", 0))
    step = a_ops["step"]
    if start >= step - 1:
        return ""
    return f"; steps {start + 1} to {step - 1} were replayed too: record step {start + 1} to compare from one state"


def _sequence(i: int, x: dict | None, y: dict | None) -> dict:
    a_text = _describe(x) if x is not None else "nothing (its recording ends)"
    b_text = _describe(y) if y is not None else "nothing (its recording ends)"
    return {
        "index": i,
        "kind": "sequence",
        "op": x["op"] if x else None,
        "where": x["where"] if x else None,
        "b_op": y["op"] if y else None,
        "b_where": y["where"] if y else None,
        "inputs_equal": None,
        "params_equal": None,
        "differing_inputs": [],
        "differing_outputs": [],
        "random": False,
        "compared": i,
        "text": f"the operation sequences diverge at operation {i}: A runs {a_text}, B runs {b_text} "
        f"(another kernel path or library version)",
    }
