"""Whether a receipt is its run directory's own: the checkpoints it lists, their weights and configs, and
metrics.jsonl's epoch records, against what the receipt (reprocube.training.receipt) records."""

from __future__ import annotations

import os
from pathlib import Path

from reprocube.config import config_hash_matches
from reprocube.errors import CheckpointError, ReprocubeError
from reprocube.formats.trace import tensor_digest
from reprocube.training.checkpoint import NAME_PATTERN, epoch_name, read_checkpoint, step_name
from reprocube.training.metrics import read_epoch_records
from reprocube.training.receipt import RECEIPT, Receipt


def is_run_directory(path: Path) -> bool:
    """A directory a training run wrote (its marker or checkpoints/, as runs.RunDirectory.is_run says): its
    receipt.json describes its checkpoints, not just itself."""
    return os.path.lexists(path / ".reprocube-run") or os.path.lexists(path / "checkpoints")


def check_own_receipt(run: Path, receipt: Receipt, error: type[ReprocubeError]) -> None:
    """That `receipt` (read from run/receipt.json) is the run directory `run`'s own, as its checkpoints and
    metrics.jsonl show: the checkpoints it lists are exactly those run/checkpoints holds; each is whole
    (every file against its verified manifest), at the position its name says, of the receipt's config, with
    the weights the receipt records there (an epoch's weights_digest; the trace's tensor digests at its
    step); the one at the receipt's position holds the receipt's config, trace and epoch records (the
    trainer writes them together); and metrics.jsonl's epoch records are the receipt's. Another run's receipt
    copied in, or a checkpoint or metrics.jsonl changed since, is one line naming the file (`error`)."""
    where = run / RECEIPT
    checkpoints = run / "checkpoints"
    if checkpoints.is_symlink() or not checkpoints.is_dir():
        raise error(f"{run} has no checkpoints/ directory: nothing there shows that {where} is this run's")
    held = sorted(p.name for p in checkpoints.iterdir() if NAME_PATTERN.match(p.name))
    listed = receipt.value["checkpoints"]
    for name in held:
        if name not in listed:
            raise error(
                f"{checkpoints / name} is not a checkpoint {where} lists ({', '.join(listed[-3:]) or 'none'}"
                f"{', ...' if len(listed) > 3 else ''}): the receipt is another run's, or older than this run"
            )
    for name in listed:
        if name not in held:
            raise error(f"{where} lists checkpoint {name}, which {checkpoints} does not hold: it is not this run's")
    position = receipt.value["position"]
    at = epoch_name(receipt.epoch) if position["step_in_epoch"] == 0 else step_name(receipt.global_step)
    if at not in held:
        raise error(f"{where} ends at {at}, which {checkpoints} does not hold: it is not this run's")
    records = {record["epoch"]: record for record in receipt.epochs}
    boundaries = {boundary.step: boundary.tensors for boundary in receipt.trace.boundaries}
    for name in held:
        try:
            checkpoint = read_checkpoint(checkpoints / name)
        except CheckpointError as exc:
            raise error(f"{exc} (so {where} cannot be shown to be this run's)") from None
        manifest, path = checkpoint.manifest, checkpoint.path
        named = epoch_name(manifest.epoch) if manifest.step_in_epoch == 0 else step_name(manifest.global_step)
        if named != name:
            raise error(f"{path}: its manifest is at {named}, not where its name says")
        if manifest.config_hash is not None and not config_hash_matches(receipt.config, manifest.config_hash):
            raise error(f"{path}: its config_hash is not {where}'s config's: the receipt is another run's")
        record = records.get(manifest.epoch) if manifest.step_in_epoch == 0 else None
        if record is not None and record["weights_digest"] != manifest.weights_digest:
            raise error(f"{path}: its weights are not the ones {where} records for epoch {manifest.epoch}")
        expected = boundaries.get(manifest.global_step)
        if expected is None and manifest.global_step > receipt.trace.first_step:
            raise error(f"{path}: {where}'s trace records no weights at its global step {manifest.global_step}")
        weights = checkpoint.content.weights
        if expected is not None and receipt.trace.tensor_names:
            digests = [tensor_digest(weights[n]) if n in weights else None for n in receipt.trace.tensor_names]
            if digests != expected:
                raise error(
                    f"{path}: its weights are not the ones {where}'s trace records at global step "
                    f"{manifest.global_step}: the receipt is another run's"
                )
        if name == at:
            held_epochs = (manifest.fields.get("metrics") or {}).get("epochs")
            state = checkpoint.content.state if isinstance(checkpoint.content.state, dict) else {}
            for what, mine in (
                ("config.json", checkpoint.content.config == receipt.config),
                ("trace (state.json)", state.get("trace") == receipt.value["trace"]),
                ("epoch records (manifest.json)", held_epochs == receipt.epochs),
            ):
                if not mine:
                    raise error(f"{path}: its {what} is not {where}'s: the receipt is another run's")
    _check_own_metrics(run, receipt, error)


def _check_own_metrics(run: Path, receipt: Receipt, error: type[ReprocubeError]) -> None:
    """metrics.jsonl's epoch records (as written: every key) are the receipt's."""
    metrics, where = run / "metrics.jsonl", run / RECEIPT
    if not os.path.lexists(metrics):
        raise error(f"{run} holds no metrics.jsonl: nothing there shows that {where} is this run's")
    logged = [{k: v for k, v in record.items() if k != "kind"} for record in read_epoch_records(metrics, error)]
    for mine, theirs in zip(logged, receipt.epochs, strict=False):
        if mine != theirs:
            raise error(f"{metrics}: the record of epoch {mine['epoch']} is not the one {where} holds")
    if len(logged) != len(receipt.epochs):
        raise error(
            f"{metrics} records {len(logged)} epochs, {where} {len(receipt.epochs)}: the receipt is not "
            "this run's, or the run went on after it (resume it to its end)"
        )
