"""clean-1's receipt, written once two uninterrupted runs agreed (reprocube.formats.script_receipt): what
`reprocube reproduce` retrains on another machine. In a new directory of --out, never one the command
planted there, nor through a link."""

from __future__ import annotations

from pathlib import Path

from reprocube.analysis.outputs import collect
from reprocube.check.evidence_dirs import DirectoryReplaced, EvidenceDirs
from reprocube.check.options import CheckOptions
from reprocube.check.runs import Run
from reprocube.formats.script_receipt import input_digests, output_digests, write_script_receipt


def write_receipt(out: Path, clean: Run, options: CheckOptions, result: dict) -> tuple[Path | None, str | None]:
    """The receipt's path, or why it could not be written (the command planted or replaced its directory).
    What it records otherwise than asked goes into the result's not-checked lines."""
    dirs = EvidenceDirs.of(out)
    outputs, seed_env = list(options.output), options.seed_env
    try:
        dirs.absent(out / "receipt")
        return write_script_receipt(
            out / "receipt",
            clean.command,
            input_digests(list(options.copy)),
            outputs,
            output_digests(collect(clean.work, outputs, list(options.ignore)), result["not_checked"]),
            clean.probe_trace(1),
            clean.attempts[-1].seconds,
            result["environment"],
            {"variable": seed_env, "value": clean.env[seed_env]} if seed_env else None,
        ), None
    except FileExistsError:  # planted between the look and the write
        try:
            dirs.absent(out / "receipt")
        except DirectoryReplaced:
            pass
        return None, dirs.message() or "receipt: planted by the command"
    except DirectoryReplaced:
        return None, dirs.message()
