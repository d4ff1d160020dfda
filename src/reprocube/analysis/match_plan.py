"""`reprocube reproduce --match`: what to set on this machine (B) to emulate the environment A's receipt
records, session by session; what cannot be emulated and why; and, once B has been retrained under those
settings, what the retraining showed. Only documented variables with checked values are ever set
(reprocube.formats.env.refused_match_setting)."""

from __future__ import annotations

import json
import sys

from reprocube.analysis.receipt_comparison import compare_receipts
from reprocube.config import DOTTED_NAME
from reprocube.formats.env import refused_match_setting
from reprocube.formats.env_comparison import NOT_NUMERIC
from reprocube.results.reproduce_wording import TOO_MANY_SESSIONS
from reprocube.runtime.cpu_emulation import CHECKED_MODELS, EMULATOR, INSTALL_HINT, NOT_INSTALLED, model_for
from reprocube.terminal import pasteable
from reprocube.training.receipt import Receipt

# CPU ISA caps that make oneDNN, ATen, MKL and XLA dispatch to AVX2 kernels on an AVX-512 machine. Not
# MKL_CBWR=AVX2: checked against the AVX2 machine's own digests (tests/test_golden_digests.py), it forces
# a code path the AVX2 machine does not take by default, and PyTorch's bits then match neither machine;
# without it they are the AVX2 machine's, bit for bit (benchmarks/cross-machine.md).
AVX2_CAPS = {
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    "ATEN_CPU_CAPABILITY": "avx2",
    "MKL_ENABLE_INSTRUCTIONS": "AVX2",
    "XLA_FLAGS": "--xla_cpu_max_isa=AVX2",
}
# Variables holding a list of flags: --match shows which of B's flags A's value drops and adds.
FLAG_LISTS = ("XLA_FLAGS",)
# The most processes --match starts to follow A's sessions (one per change of settings): its cost stays
# bounded by A's own work whatever A's sessions look like (a receipt is someone else's file: 16 one-step
# sessions alternating between two settings would otherwise start 16). Beyond it, --match is refused, named.
MAX_MATCH_PROCESSES = 4


def match_plan(a: Receipt, b: Receipt, causes: list[dict], emulator: bool = False) -> dict:
    """What --match would set to emulate A here, session by session: A's documented numeric variables
    where B's differ (None: unset it); for an AVX2 A on an AVX-512 B, A's CPU emulated where `emulator`
    (qemu-x86_64) is installed and a checked model presents it (`cpu`: reprocube.runtime.cpu_emulation), the AVX2
    caps otherwise; what cannot be emulated and why; the variables refused (only documented ones with
    checked values are ever set: reprocube.formats.env). Where A's sessions ran under different settings,
    `segments` says which settings train which steps."""
    segments, cannot, not_applied = [], [], []
    for session in a.sessions:
        plan = _session_plan(session["env"], b.env, causes, emulator)
        segments.append(
            {
                "from_step": session["from_step"],
                "to_step": session["to_step"],
                "settings": plan["settings"],
                "cpu": plan["cpu"],
            }
        )
        cannot += [c for c in plan["cannot"] if c not in cannot]
        not_applied += [r for r in plan["not_applied"] if r not in not_applied]
    segments = _merge_equal(segments)
    if len(segments) > MAX_MATCH_PROCESSES:
        refused = (
            f"{TOO_MANY_SESSIONS} {len(segments) - 1} times: --match follows at most "
            f"{MAX_MATCH_PROCESSES - 1} changes (one process each), so it emulated nothing"
        )
        return {
            "settings": {},
            "cpu": None,
            "b_env": b.env,
            "segments": None,
            "cannot": cannot,
            "not_applied": not_applied,
            "refused": refused,
        }
    followed = len({json.dumps([s["settings"], s["cpu"]], sort_keys=True) for s in segments}) > 1
    return {
        "settings": segments[0]["settings"],
        "cpu": segments[0]["cpu"],  # the emulated CPU model (None: this machine's own CPU)
        "b_env": b.env,  # what the settings replace (settings_text says which flags are dropped)
        "segments": segments if followed else None,  # None: one set of settings for every step
        "cannot": cannot,
        "not_applied": not_applied,
    }


def session_settings(a_env: dict, b_env: dict) -> dict:
    """What --match sets here (b_env) to emulate one environment of A (a_env), and what it cannot: a
    script receipt's single session (no config to tell apart). Never an emulated CPU: a script's command
    may start processes, and those would run on this CPU (qemu-user does not follow exec)."""
    return _session_plan(a_env, b_env, [], emulator=None)


def _merge_equal(segments: list[dict]) -> list[dict]:
    """Segments that train steps, consecutive ones under equal settings joined: B runs one process per
    change of settings, however many sessions A had (at least one segment)."""
    merged: list[dict] = []
    for segment in segments:
        if segment["to_step"] <= segment["from_step"]:
            continue
        if merged and (merged[-1]["settings"], merged[-1]["cpu"]) == (segment["settings"], segment["cpu"]):
            merged[-1] = {**merged[-1], "to_step": segment["to_step"]}
        else:
            merged.append(dict(segment))
    return merged or segments[:1]


def _session_plan(a_env: dict, b_env: dict, causes: list[dict], emulator: bool | None) -> dict:
    """`emulator`: whether qemu-x86_64 is installed (None: no CPU is emulated for this command)."""
    env, cannot, not_applied, cpu = {}, [], [], None
    a_vars = a_env.get("env_vars") if isinstance(a_env.get("env_vars"), dict) else {}
    b_vars = b_env.get("env_vars") if isinstance(b_env.get("env_vars"), dict) else {}
    for key in sorted(set(a_vars) | set(b_vars)):
        if f"env_vars.{key}" in NOT_NUMERIC or a_vars.get(key) == b_vars.get(key):
            continue
        refused = refused_match_setting(key, a_vars.get(key))  # only documented variables, checked values
        if refused:
            not_applied.append({"key": key, "reason": refused})
        else:
            env[key] = a_vars.get(key)  # None: unset it
    isa_a = set(_isa(a_env))
    isa_b = set(_isa(b_env))
    if "avx512f" in isa_b and "avx512f" not in isa_a and isa_a:
        model = model_for(a_env.get("cpu"), sorted(isa_b))  # the checked model that presents A's CPU
        cpu = model if emulator else None
        for key, value in AVX2_CAPS.items() if cpu is None else ():  # an emulated CPU needs no caps
            if key not in a_vars:  # A had none: the cap replaces B's value or B's lack of one
                env[key] = value
        if model and cpu is None:
            cannot.append(
                (
                    f"{NOT_INSTALLED} ({INSTALL_HINT})"
                    if emulator is False
                    else "A's CPU exactly for a script's command (reprocube emulates it for its own trainers only)"
                )
                + "; the ISA caps set instead gave the AVX2 machine's bits for TensorFlow and PyTorch, not for JAX"
            )
    missing = sorted(isa_a - isa_b)
    if missing:
        cannot.append(f"A's CPU had {', '.join(missing)}, which this CPU lacks: its kernels cannot run here")
    affecting = [c["key"] for c in causes if c["kind"] == "config"]
    if affecting:
        cannot.append(
            f"config differences ({', '.join(affecting)}) are not emulated: they are A's config, not settings"
        )
    if not_applied:
        cannot.append(
            f"not applied (reported only; --match sets only documented ISA and thread variables): "
            f"{', '.join(row['key'] for row in not_applied)}"
        )
    return {"settings": env, "cpu": cpu, "cannot": cannot, "not_applied": not_applied}


def match_outcome(plan: dict, a: Receipt, matched: Receipt | None) -> dict:
    """--match's result: `matched` is B retrained under plan["settings"] (None: nothing to emulate)."""
    cannot, not_applied = plan["cannot"], plan["not_applied"]
    if matched is None and not plan["segments"]:
        if plan.get("refused"):
            summary = plan["refused"] + (f" ({'; '.join(cannot)})" if cannot else "")
        else:
            summary = "nothing this machine can emulate differs from A" + (f" ({'; '.join(cannot)})" if cannot else "")
        return {
            "settings": {},
            "cpu": None,
            "segments": None,
            "ran": False,
            "bit_identical": None,
            "recipe": None,
            "cannot": cannot,
            "not_applied": not_applied,
            "summary": summary,
        }
    outcome = compare_receipts(a, matched)
    shown = settings_text(plan["settings"], plan.get("b_env"), plan.get("cpu"))
    if plan["segments"]:
        shown = (
            "A's sessions followed ("
            + "; ".join(
                f"steps {s['from_step'] + 1}..{s['to_step']}: "
                f"{settings_text(s['settings'], cpu=s['cpu']) or 'this environment'}"
                for s in plan["segments"]
            )
            + ")"
        )
    first = outcome["first_divergence"]
    if outcome["identical"]:
        summary = f"with {shown}, B reproduces A bit for bit"
    elif first is not None:
        summary = f"with {shown}, B still differs (first at step {first['step']})"
    else:  # every step agrees; what differs is elsewhere (A's config, an evaluation, what was not checked)
        elsewhere = "; ".join(outcome["reasons"]) or "an evaluation differs"
        summary = f"with {shown}, every training step of B agrees with A's, but B is not bit-identical: {elsewhere}"
    return {
        "settings": plan["settings"],
        "cpu": plan["cpu"],  # the emulated CPU model B ran on (None: its own)
        "segments": plan["segments"],
        "ran": True,
        "run": str(matched.path.parent),
        "bit_identical": outcome["identical"],
        "recipe": None,
        "cannot": cannot,
        "not_applied": not_applied,
        "summary": summary,
    }


def settings_text(env: dict, b_env: dict | None = None, cpu: str | None = None) -> str:
    """The settings as KEY=VALUE (or KEY unset), after the emulated CPU where there is one; with B's
    environment, a flag list (XLA_FLAGS) also says which of B's flags it drops and which it adds: the
    value alone names the flags the trainer adds."""
    b_vars = (b_env or {}).get("env_vars") if isinstance((b_env or {}).get("env_vars"), dict) else {}
    shown = [f"A's CPU emulated ({EMULATOR} -cpu {cpu})"] if cpu else []
    for key, value in env.items():
        text = f"{key}={value}" if value is not None else f"{key} unset"
        if key in FLAG_LISTS and b_env is not None:
            mine, theirs = set((value or "").split()), set(str(b_vars.get(key) or "").split())
            change = [
                f"drops {' '.join(sorted(theirs - mine))}" if theirs - mine else "",
                f"adds {' '.join(sorted(mine - theirs))}" if mine - theirs else "",
            ]
            text += f" ({'; '.join(c for c in change if c)})" if any(change) else ""
        shown.append(text)
    return ", ".join(shown)


def _isa(env: dict) -> list[str]:
    cpu = env.get("cpu")
    isa = cpu.get("isa") if isinstance(cpu, dict) else None
    return [f for f in isa if isinstance(f, str)] if isinstance(isa, list) else []


def recipe_refusal(recipe: list[dict], a: Receipt, matched: Receipt | None) -> str | None:
    """Why the commands a reproduce result records are not to be shown for a person to run (None: they may
    be). A recipe is shown only where this reproduction's own --match run stands behind it: `matched`, the
    run under runs/b-matched bound by the sha256 of its receipt, has A's bits, and each command set what
    that run's process ran under; each command is of the one form match_recipe writes (documented variables
    with checked values, then reprocube train, or the emulator running this interpreter, with dotted-name
    overrides), so that a result made elsewhere cannot offer anything else to copy."""
    if matched is None:
        return "no --match run of this reproduction (runs/b-matched, bound by its sha256) stands behind it"
    if not compare_receipts(a, matched)["identical"]:
        return "the --match run behind it (runs/b-matched) does not have A's bits"
    if len(matched.sessions) != len(recipe):
        return f"it has {len(recipe)} commands where the --match run behind it ran {len(matched.sessions)} processes"
    for number, (command, session) in enumerate(zip(recipe, matched.sessions, strict=True), 1):
        refused = _command_refusal(command, session["env"])
        if refused:
            return f"command {number}: {refused}"
    return None


def _command_refusal(command: dict, ran_env: dict) -> str | None:
    ran = ran_env.get("env_vars") if isinstance(ran_env.get("env_vars"), dict) else {}
    for key, value in command["env"].items():
        refused = refused_match_setting(key, value)
        if refused:
            return f"a variable --match never sets, or a value it never takes ({refused})"
        if key in FLAG_LISTS and value is not None:  # the trainer may add flags of its own to what was set
            agrees = isinstance(ran.get(key), str) and set(value.split()) <= set(ran[key].split())
        else:
            agrees = ran.get(key) == value
        if not agrees:
            return f"it sets a variable ({key}) other than the --match run behind it ran with"
    argv = command["argv"]
    if argv[:1] == ["reprocube"]:
        rest = argv[1:]
    elif (
        argv[:2] == [EMULATOR, "-cpu"]
        and len(argv) > 7
        and argv[2] in {name for name, _, _ in CHECKED_MODELS}
        and argv[3] == sys.executable  # qemu-user runs a path: only this reprocube's own interpreter
        and argv[4:7] == ["-P", "-m", "reprocube"]  # -P: never a reprocube from the directory it runs in
    ):
        rest = argv[7:]
    else:
        return (
            "it runs something other than reprocube train (or, on the emulated CPU, the interpreter of the "
            "reprocube drawing this page)"
        )
    if rest[:1] != ["train"]:
        return "it runs something other than reprocube train"
    for word in rest[1:]:
        if not pasteable(word):
            return "an argument holds a control or format character (a paste could act on it)"
        key, equals, value = word.partition("=")
        if not equals or not DOTTED_NAME.fullmatch(key) or key.split(".")[0] == "hydra" or "${" in value:
            return "an argument is not a plain config override (a dotted key, a value without interpolation)"
    return None
