"""The probe: two calls in someone else's training loop that let `reprocube check` name the first step at
which a resumed run departs from an uninterrupted one, and after which stop.

    from reprocube import probe
    ...
    optimizer.step()
    probe.step(loss, model)          # after every optimizer step: the loss and the weights (or a step=N)
    ...
    torch.save(state, "ckpt.pt")
    probe.checkpoint(step)           # after the script wrote a checkpoint at this global step

or, for a plain PyTorch loop, one line in place of `probe.step`: `probe.watch(optimizer, model)` (watch).

It does nothing unless `reprocube check` runs the script: check sets REPROCUBE_PROBE to the file this
attempt's trace goes to (the only variable the probe reads). Each step records the loss's exact bits and
the weight fingerprint of reprocube's own trainers (per tensor, the sum modulo 2**32 of its mixed bit
patterns: reprocube.formats.trace.mix), computed with the framework's own operations where the weights live (no
host sync per step): records are fetched in groups of GROUP steps, at each checkpoint and at exit.
PyTorch (a Module, a state_dict or tensors), JAX (any pytree of arrays), TensorFlow/Keras (a Model or
variables) and NumPy (a dict or list of arrays) are understood; a float32 tensor's fingerprint equals
reprocube.formats.trace.fingerprint's, other dtypes are fingerprinted by their bits as well.

Several processes (torchrun, Accelerate, DeepSpeed): one trace per rank. The rank is read from RANK,
else LOCAL_RANK (a single-node launcher's), else it is 0; it must be a decimal integer 0..65535 (ASCII
digits, no sign or spaces; below WORLD_SIZE where that is set, itself 1..65536), or the probe's first call
raises ValueError. Rank 0 writes the path REPROCUBE_PROBE names; rank r > 0 writes beside it, the suffix
kept: `attempt-1.jsonl` -> `attempt-1.rank-3.jsonl` (rank_path). A process with no rank variable is rank 0,
so a single-process script's trace is where it always was.

A script that restores a checkpoint may say where it resumed, before its first step:
`probe.resumed(step)` (the steps the checkpoint holds); check then places the attempt's updates from there
instead of finding the place by the first update's bits.

The trace is JSON lines: one header (`{"probe": 2}`; version 1 had no `at`, with `"rank": r, "world_size": w|null` where a rank
variable is set), `{"names": [...]}`, an optional `{"resumed": s}` before the first step, then
`{"index": i, "step": s|null, "loss": hex, "loss_dtype": ..., "fingerprints": [...], "at": t}` per step (index
counts this attempt's steps from 1; step is what the script passed, if anything; at: when the step was
recorded, time.monotonic()'s seconds, the system's CLOCK_MONOTONIC that check's signal times are on, so
check tells an update made after its stop's signal from one made before) and
`{"checkpoint": s, "after_index": i}` per checkpoint. Version 3 adds to each update `"streams"`, the digests of
the random generators and of the batch (reprocube.probe_streams: `{"torch": hex, "numpy": hex, "python": hex,
"passed.NAME": hex, "batch": hex}`, those there are), and `"lr"` where the learning rate was given (a list of
numbers, one per parameter group). reprocube.analysis.probe_trace reads it, strictly.

The streams do not depend on the numbers: where non-deterministic kernels make the weights of two runs differ
from the first step, a correct resume still gives the uninterrupted run's generators, batches and learning rates
(issue 67). `probe.step(loss, model, batch=..., lr=..., generators={...})` gives the probe what it cannot see
by itself; the two calls alone record the generators of torch, NumPy and Python's `random`."""

from __future__ import annotations

import atexit
import json
import os
import re
import sys
import time

# The fingerprint as the probe records it stays reprocube.probe.array_fingerprint (the probe's public API).
from reprocube.probe_fingerprints import array_fingerprint as array_fingerprint
from reprocube.probe_fingerprints import loss_bits, named_tensors, snapshot_of, weight_fingerprints

# What the callbacks and a script's own loop digest themselves (reprocube.probe_streams).
from reprocube.probe_streams import batch_digest as batch_digest
from reprocube.probe_streams import digest, learning_rates, seen_generators
from reprocube.probe_streams import passed_generators as passed_generators

ENV = "REPROCUBE_PROBE"  # the attempt's trace file; set only by `reprocube check`
VERSION = 3  # 2: each update has "at"; 3: "streams", and "lr" where given (probe_trace reads 1 to 3)
GROUP = 64  # steps whose fingerprints stay on the device before one fetch
RANK_ENVS = ("RANK", "LOCAL_RANK")  # the global rank (torchrun, Accelerate, DeepSpeed), else the node-local one
MAX_RANK = 65535
_DECIMAL = re.compile(r"(0|[1-9][0-9]{0,5})\Z", re.ASCII)


def _env_integer(name: str, low: int, high: int) -> int | None:
    text = os.environ.get(name)
    if text is None:
        return None
    if not _DECIMAL.match(text) or not low <= int(text) <= high:
        raise ValueError(f"reprocube probe: {name}={text[:40]!r} is not an integer from {low} to {high}")
    return int(text)


def rank() -> tuple[int, int | None, bool]:
    """(rank, world size or None, whether a rank variable was set), from the launcher's variables only."""
    world = _env_integer("WORLD_SIZE", 1, MAX_RANK + 1)
    for name in RANK_ENVS:
        value = _env_integer(name, 0, MAX_RANK)
        if value is not None:
            if world is not None and value >= world:
                raise ValueError(f"reprocube probe: {name}={value} is not below WORLD_SIZE={world}")
            return value, world, True
    return 0, world, False


def rank_path(path: str, rank: int) -> str:
    """Rank 0's trace is `path`; rank r's is beside it: attempt-1.jsonl -> attempt-1.rank-r.jsonl."""
    if rank == 0:
        return path
    head, tail = os.path.split(path)
    stem, dot, suffix = tail.rpartition(".") if "." in tail.lstrip(".") else (tail, "", "")
    return os.path.join(head, f"{stem}.rank-{rank}{dot}{suffix}")


class _Recorder:
    def __init__(self, path: str, rank: int = 0, world_size: int | None = None, ranked: bool = False):
        # A new file only, never through a link: check names a path in its own evidence directory.
        path = rank_path(path, rank)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_APPEND, 0o644)
        self.file = os.fdopen(fd, "w")
        self._write({"probe": VERSION, **({"rank": rank, "world_size": world_size} if ranked else {})})
        self.names: list[str] | None = None
        # index, step, loss, (the adapter of the weights' framework, their fingerprints on the device), when,
        # the streams' digests and the learning rates (None: not given)
        self.pending: list[tuple[int, int | None, object, tuple[type, object], float, dict, list | None]] = []
        self.index, self.last_step, self.resumed_at = 0, 0, None

    def resumed(self, step: int) -> None:
        if step < 0:
            raise ValueError(f"reprocube probe: resumed({step}): give the steps the checkpoint holds (>= 0)")
        if self.index or self.resumed_at is not None:
            raise ValueError("reprocube probe: resumed() is said once, before the attempt's first step")
        self.resumed_at = self.last_step = step  # a step= given later continues after it
        self._write({"resumed": step})

    def step(self, loss, params, step: int | None, given: dict | None = None, lr=None) -> None:
        """`given`: the digests of the streams the caller gave (the batch, named generators)."""
        if step is not None:  # wrong here, not silently dropped by the reader later
            if step < 1 or step <= self.last_step:
                raise ValueError(
                    f"reprocube probe: step={step}: give the global step of the update just done, "
                    f"counting from 1 and increasing (the last was {self.last_step})"
                )
            self.last_step = step
        names, tensors = named_tensors(params)
        if self.names is None:
            self.names = names
            self._write({"names": names})
        elif names != self.names:
            raise ValueError(f"reprocube probe: the weights' names changed ({len(names)} tensors now)")
        streams = {**seen_generators(), **(given or {})}
        rates = None if lr is None else learning_rates(lr)
        self.index += 1
        at = time.monotonic()
        self.pending.append((self.index, step, snapshot_of(loss), weight_fingerprints(tensors), at, streams, rates))
        if len(self.pending) >= GROUP:
            self.flush()

    def checkpoint(self, step: int) -> None:
        if step < 0:
            raise ValueError(f"reprocube probe: checkpoint({step}): give the steps done so far (>= 0)")
        self.flush()
        self._write({"checkpoint": step, "after_index": self.index})

    def flush(self) -> None:
        for index, step, loss, (adapter, fingerprints), at, streams, rates in self.pending:
            value, dtype = loss_bits(loss)
            self._write(
                {
                    "index": index,
                    "step": step,
                    "loss": value,
                    "loss_dtype": dtype,
                    "fingerprints": [int(f) & 0xFFFFFFFF for f in adapter.to_host(fingerprints)],
                    "at": round(at, 6),
                    "streams": streams,
                    **({"lr": rates} if rates is not None else {}),
                }
            )
        self.pending.clear()

    def _write(self, record: dict) -> None:
        self.file.write(json.dumps(record, separators=(",", ":")) + "\n")
        self.file.flush()


_recorder: _Recorder | None = None
_started = False


def _active() -> _Recorder | None:
    global _recorder, _started
    if not _started:
        _started = True
        path = os.environ.get(ENV)
        if path:
            _recorder = _Recorder(path, *rank())
            atexit.register(_recorder.flush)
    return _recorder


def step(loss, params, step: int | None = None, *, batch=None, lr=None, generators=None) -> None:
    """Record one optimizer step: its loss (a scalar of any framework) and the weights after it. `step`:
    the global step, if the script knows it (else check counts from the checkpoint it resumed from). Optional,
    the streams the probe cannot see by itself (reprocube.probe_streams): `batch`, the update's input (arrays,
    or a dict, list or tuple of them); `lr`, the learning rate it used (or one per parameter group);
    `generators`, named generators the script keeps itself (a JAX key, a `tf.random.Generator`, ...)."""
    recorder = _active()
    if recorder is not None:
        given = passed_generators(generators)
        if batch is not None:
            given["batch"] = batch_digest(batch)
        recorder.step(loss, params, None if step is None else int(step), given, lr)


def checkpoint(step: int) -> None:
    """The script has just written a checkpoint at this global step (steps done so far)."""
    recorder = _active()
    if recorder is not None:
        recorder.checkpoint(int(step))


def resumed(step: int) -> None:
    """This attempt restored a checkpoint holding `step` steps (0: it starts afresh): said once, before the
    attempt's first `probe.step`. Optional: without it check finds where a restart resumed by its first
    update's bits, or assumes the last checkpoint announced."""
    recorder = _active()
    if recorder is not None:
        recorder.resumed(int(step))


def watch(optimizer, model=None):
    """The one line for a plain PyTorch loop, in place of `probe.step`: `optimizer = probe.watch(optimizer,
    model)` once, after the optimizer is built. Every `optimizer.step()` that updates the weights (a
    GradScaler's skipped step is none; gradient accumulation's micro-batches call no step) is then recorded
    with the weights after it: `model`'s state_dict (its buffers too), else the optimizer's parameters,
    named `GROUP.INDEX`. The loss is not the optimizer's to see: it is recorded as NaN and the weights tell
    where a run departs. Each record is written at once. No step number: check places each restart by its
    first update's bits; where those are no single update of the uninterrupted run (a resume bug, or an
    update that changes nothing), the restart's updates are not compared unless `probe.resumed(step)` after
    loading or `probe.checkpoint(step)` after each save says where it is. Returns `optimizer`; inert outside
    `reprocube check` (no hook is added)."""
    if _active() is None:
        return optimizer
    if model is None:
        params = {
            f"{g}.{i}": p for g, group in enumerate(optimizer.param_groups) for i, p in enumerate(group["params"])
        }
    else:
        params = model

    def after_step(optimizer, args, kwargs):
        _recorder.step(float("nan"), params, None, lr=[group["lr"] for group in optimizer.param_groups])
        _recorder.flush()  # written at once: a plain loop killed by the stop runs no atexit

    optimizer.register_step_post_hook(after_step)
    return optimizer


def keras_callback():
    """For Keras `model.fit`, which owns the loop: a callback that records every batch and announces every
    backup, wherever it stands in the callback list.

    - Each batch's update is recorded in on_train_batch_end with the loss `fit` reports there (the epoch's
      running mean) and, as its step, the optimizer's own counter (`model.optimizer.iterations`, which
      `BackupAndRestore` and `load_weights` restore with the weights): an update is placed by the model's
      state, not by counting batches or epochs, and not by when a checkpoint was announced. The record is
      written at once (fit has already waited for the batch: callbacks get its logs as Python floats, so
      the fetch waits only for the fingerprints): a stop that lands while other callbacks run (a line
      printed at the epoch's end) loses nothing.
    - `BackupAndRestore` callbacks in the same list are found when training begins, and each of their saves
      is announced right after it is written, at the optimizer's step: at the epoch's end or every
      `save_freq` batches (a mid-epoch backup is restored mid-epoch, and Keras then starts that epoch again
      at its first batch). Without one, each epoch's end is announced (whatever saves there).
    - At the first batch, an optimizer whose counter is above 0 was restored: `resumed` is said with it."""
    import keras

    class ProbeCallback(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.backups: list = []
            self.began = False

        def on_train_begin(self, logs=None):
            self.began = False
            self.backups = _keras_backups(self, keras)
            for backup in self.backups:
                _announce_saves(backup)

        def on_train_batch_begin(self, batch, logs=None):
            if self.began:
                return
            self.began = True  # after every callback's on_train_begin: BackupAndRestore has restored
            recorder, done = _active(), _keras_iterations(self.model)
            if recorder is not None and recorder.index == 0 and recorder.resumed_at is None and done:
                recorder.resumed(done)

        def on_train_batch_end(self, batch, logs=None):
            recorder = _active()
            if recorder is None:
                return
            done = _keras_iterations(self.model)
            rate = getattr(getattr(self.model, "optimizer", None), "learning_rate", None)  # a schedule's current one
            step = done if done and done > recorder.last_step else None
            recorder.step(logs["loss"], self.model, step, lr=rate)
            recorder.flush()

        def on_epoch_end(self, epoch, logs=None):
            if not self.backups:
                done = _keras_iterations(self.model)
                checkpoint(done if done is not None else (epoch + 1) * (self.params.get("steps") or 0))

    return ProbeCallback()


def transformers_callback():
    """For the Hugging Face `Trainer`, which owns the loop: a `TrainerCallback` (`callbacks=[...]`) that
    records every optimizer update and announces every checkpoint the Trainer writes.

    - Each update is recorded in on_step_end at the Trainer's own count (`state.global_step`, which a
      resumed Trainer restores from the checkpoint's trainer_state.json), with the weights of the model
      after it and the loss its forward passes returned since the last update (the model output's `loss`,
      summed over gradient accumulation's micro-batches; NaN where the model returns none, for a
      `compute_loss` of the Trainer's own: the weights still tell). The record is written at once.
    - Each checkpoint (`save_steps`/`save_strategy`) is announced in on_save, which the Trainer calls after
      the checkpoint directory is written, at `state.global_step`.
    - on_train_begin comes after `train(resume_from_checkpoint=...)` restored the state: a global step
      above 0 there is said as `resumed`.
    Inert outside `reprocube check`; transformers is imported when this is called, not with the probe."""
    from transformers import TrainerCallback

    class ProbeCallback(TrainerCallback):
        def __init__(self):
            self.hooked = None
            self.loss = None
            self.batches = _Batches()

        def on_train_begin(self, args, state, control, model=None, **kwargs):
            recorder = _active()
            if recorder is None:
                return
            if model is not None and self.hooked is not model:
                model.register_forward_hook(self._forward, with_kwargs=True)
                self.hooked = model
            if recorder.index == 0 and recorder.resumed_at is None and state.global_step:
                recorder.resumed(state.global_step)

        def _forward(self, module, inputs, keywords, output):
            if not module.training:  # evaluation's forward passes are no update's
                return
            tensors = {k: v for k, v in keywords.items() if hasattr(v, "detach")}  # not flags, not a cache
            self.batches.add({"args": [v for v in inputs if hasattr(v, "detach")], **tensors})
            loss = output.get("loss") if isinstance(output, dict) else getattr(output, "loss", None)
            if loss is not None and hasattr(loss, "detach") and loss.numel() == 1:
                loss = loss.detach().float().reshape(())
                self.loss = loss.clone() if self.loss is None else self.loss + loss

        def on_step_end(self, args, state, control, model=None, **kwargs):
            recorder = _active()
            if recorder is None:
                return
            loss, self.loss = (float("nan") if self.loss is None else self.loss), None
            step = state.global_step if state.global_step > recorder.last_step else None
            optimizer = kwargs.get("optimizer")
            rates = [group["lr"] for group in optimizer.param_groups] if optimizer is not None else None
            recorder.step(loss, model, step, self.batches.take(), rates)
            recorder.flush()

        def on_save(self, args, state, control, **kwargs):
            checkpoint(state.global_step)

    return ProbeCallback()


def lightning_callback():
    """For Lightning's `Trainer.fit`, which owns the loop: a `lightning.pytorch.Callback` that records
    every optimizer update and announces every checkpoint the Trainer writes.

    - Each update is recorded in on_train_batch_end when the Trainer's count of optimizer steps
      (`trainer.global_step`, restored by `fit(ckpt_path=...)`) has advanced (gradient accumulation's
      other batches are no update), at that count, with the LightningModule's weights (its state_dict)
      and the loss `training_step` returned (NaN where it returned none: manual optimization). The
      record is written at once. `ModelCheckpoint` runs after every other callback, so the update is
      recorded before the checkpoint that holds it is written.
    - Every checkpoint is announced right after it is written, at `trainer.global_step`: the callback
      wraps this Trainer's `save_checkpoint` (ModelCheckpoint's `every_n_train_steps`, `save_last`, and
      your own calls all go through it).
    - on_train_start comes after the checkpoint was restored: a global step above 0 there is said as
      `resumed`.
    Inert outside `reprocube check`; lightning is imported when this is called (the `lightning` package,
    else `pytorch_lightning`)."""
    try:
        from lightning.pytorch import Callback
    except ImportError:
        from pytorch_lightning import Callback

    class ProbeCallback(Callback):
        def __init__(self):
            self.batches = _Batches()

        def setup(self, trainer, pl_module, stage):
            save = trainer.save_checkpoint
            if _active() is None or getattr(save, "reprocube_probe", False):
                return

            def saved(*args, **kwargs):
                result = save(*args, **kwargs)
                checkpoint(trainer.global_step)
                return result

            saved.reprocube_probe = True
            trainer.save_checkpoint = saved

        def on_train_start(self, trainer, pl_module):
            recorder = _active()
            if recorder is not None and recorder.index == 0 and recorder.resumed_at is None and trainer.global_step:
                recorder.resumed(trainer.global_step)

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            recorder = _active()
            if recorder is None:
                return
            self.batches.add(batch)
            done = trainer.global_step
            if done <= recorder.last_step:
                return  # no optimizer step since the last record (gradient accumulation)
            loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
            if loss is None or not hasattr(loss, "detach"):
                loss = float("nan") if loss is None or not isinstance(loss, float | int) else float(loss)
            rates = [group["lr"] for optimizer in trainer.optimizers for group in optimizer.param_groups]
            recorder.step(loss, pl_module, done, self.batches.take(), rates or None)
            recorder.flush()

    return ProbeCallback()


class _Batches:
    """The batches a trainer's callback saw since the last update (gradient accumulation's micro-batches
    too), as the one batch stream of that update."""

    def __init__(self):
        self.digests: list[str] = []

    def add(self, batch) -> None:
        self.digests.append(batch_digest(batch))

    def take(self) -> dict:
        seen, self.digests = self.digests, []
        if not seen:
            return {}
        return {"batch": seen[0] if len(seen) == 1 else digest(*(d.encode() for d in seen))}


def _keras_iterations(model) -> int | None:
    """The optimizer's count of updates applied (restored with the weights), or None without one."""
    iterations = getattr(getattr(model, "optimizer", None), "iterations", None)
    return None if iterations is None else int(iterations.numpy() if hasattr(iterations, "numpy") else iterations)


def _keras_backups(callback, keras) -> list:
    """The BackupAndRestore callbacks listed beside `callback`: found through the CallbackList calling its
    on_train_begin (Keras gives a callback no handle on the others)."""
    frame = sys._getframe(1)
    for _ in range(6):
        if frame is None:
            break
        owner = frame.f_locals.get("self")
        if isinstance(owner, keras.callbacks.CallbackList) and any(c is callback for c in owner.callbacks):
            return [c for c in owner.callbacks if isinstance(c, keras.callbacks.BackupAndRestore)]
        frame = frame.f_back
    return []


def _announce_saves(backup) -> None:
    """Wrap this BackupAndRestore's save (on the instance, once) so that each save, whenever it happens,
    is announced right after it was written, at the optimizer's step."""
    save = getattr(backup, "_save_model", None)
    if save is None or getattr(save, "reprocube_probe", False):
        return

    def saved(*args, **kwargs):
        result = save(*args, **kwargs)
        done = _keras_iterations(backup.model)
        if done is not None:
            checkpoint(done)
        return result

    saved.reprocube_probe = True
    backup._save_model = saved
