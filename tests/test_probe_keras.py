"""The probe's Keras callback (issue 53, item 7) with a real `model.fit` and `BackupAndRestore`: backups
at any `save_freq` are announced, a restart says where it resumed (the optimizer's restored step count),
each update is placed by that count, and none of it depends on where the callback stands in the list."""

from __future__ import annotations

import numpy as np
import pytest

from reprocube import probe
from reprocube.analysis.probe_trace import read_trace
from reprocube.analysis.probe_trace_comparison import compare_stopped

keras = pytest.importorskip("keras")

DATA = np.random.default_rng(1234)
X = DATA.normal(size=(256, 8)).astype("float32")  # 4 batches of 64: an epoch is 4 updates
Y = (X @ DATA.normal(size=8) > 0).astype("int64")


class Stopped(Exception):
    pass


class StopAt(keras.callbacks.Callback):
    """The process's end at a moment of its choosing (what check's stop does), by raising out of fit."""

    def __init__(self, when: str, at: int):
        super().__init__()
        self.when, self.at = when, at

    def on_train_batch_begin(self, batch, logs=None):
        if self.when == "batch" and int(self.model.optimizer.iterations) == self.at:
            raise Stopped

    def on_epoch_end(self, epoch, logs=None):  # like a script printing "epoch N saved" where check stops it
        if self.when == "epoch" and epoch + 1 == self.at:
            raise Stopped


def attempt(tmp_path, monkeypatch, name: str, order: list[str], save_freq="epoch", stop=None):
    """One process's fit (a fresh model, seeded): its probe trace, read back, and its bytes."""
    monkeypatch.setenv(probe.ENV, str(tmp_path / f"{name}.jsonl"))
    for variable in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setattr(probe, "_recorder", None)
    monkeypatch.setattr(probe, "_started", False)
    tmp_path.mkdir(parents=True, exist_ok=True)
    keras.backend.clear_session()
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [keras.Input((8,)), keras.layers.Dense(8, activation="relu", name="hidden"), keras.layers.Dense(2, name="out")],
        name="net",
    )
    model.compile(
        optimizer=keras.optimizers.SGD(0.1, momentum=0.9),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    made = {
        "probe": probe.keras_callback(),
        "backup": keras.callbacks.BackupAndRestore(str(tmp_path / "backup"), save_freq=save_freq),
        "stop": StopAt(*stop) if stop else StopAt("never", 0),
    }
    try:
        model.fit(X, Y, batch_size=64, epochs=3, shuffle=False, verbose=0, callbacks=[made[n] for n in order])
    except Stopped:
        pass
    probe._recorder.file.close()
    path = tmp_path / f"{name}.jsonl"
    return read_trace(path), path.read_bytes()


def test_a_backup_every_n_batches_is_announced_and_a_mid_epoch_restart_is_placed(tmp_path, monkeypatch):
    """BackupAndRestore(save_freq=3) saves at updates 3, 6, 9, 12. Stopped before update 8, the restart
    restores update 6's weights but begins epoch 2 again at its first batch: update 7 is the first that
    departs (before: no backup was announced, so the reader assumed a restart at epoch 1's end, step 4 -
    and named step 5)."""
    order = ["backup", "probe", "stop"]
    clean, _ = attempt(tmp_path / "c", monkeypatch, "clean", order, save_freq=3)
    assert clean.checkpoints == [3, 6, 9, 12] and [s for s, _ in clean.updates] == list(range(1, 13))
    assert all(len(u.lr) == 1 and u.lr[0] > 0 for _, u in clean.updates)  # the optimizer's rate (issue 67)
    first, _ = attempt(tmp_path, monkeypatch, "attempt-1", order, save_freq=3, stop=("batch", 7))
    assert first.checkpoints == [3, 6] and len(first.updates) == 7 and first.resumed is None
    second, _ = attempt(tmp_path, monkeypatch, "attempt-2", order, save_freq=3)
    assert second.resumed == 6 and second.updates[0][0] == 7  # the optimizer's count, restored
    assert len(second.updates) == 8  # epochs 2 and 3 in full: Keras does not skip the batches already done
    result = compare_stopped(clean, [first, second])
    assert (result["attempts"][1]["resumed_at"], result["attempts"][1]["how"]) == (6, "given")
    difference = result["first_difference"]
    assert (difference["step"], difference["after_stop"], difference["loss_same"]) == (7, 1, False)
    assert difference["cause_hint"].startswith("another loss at update 7")  # epoch 2's first batch, not its third
    assert result["extra_steps"] == [[13, 14]]


def _without_times(trace: bytes) -> bytes:
    """A trace's bytes without each update's time ("at"): what two runs at other moments can share."""
    import json

    records = [json.loads(line) for line in trace.splitlines()]
    return b"\n".join(
        json.dumps({k: v for k, v in r.items() if k != "at"}, separators=(",", ":")).encode() for r in records
    )


def test_the_callback_records_the_same_wherever_it_stands(tmp_path, monkeypatch):
    """A stop where the script prints its epoch-end line (StopAt, listed after BackupAndRestore): before,
    a probe listed after that callback had neither written the epoch's updates (fetched every 64) nor
    announced the checkpoint, so the restart was assumed to begin at step 0 and its first update (step 5)
    was named as step 1. Now every position writes the same bytes, and the restart resumes at update 4."""
    written = []
    for position in (0, 1, 2):
        order = ["backup", "stop"]
        order.insert(position, "probe")
        where = tmp_path / f"position-{position}"
        clean, clean_bytes = attempt(where / "clean", monkeypatch, "clean", order)
        assert clean.checkpoints == [4, 8, 12]
        first, first_bytes = attempt(where, monkeypatch, "attempt-1", order, stop=("epoch", 1))
        assert first.checkpoints == [4] and len(first.updates) == 4, order
        second, second_bytes = attempt(where, monkeypatch, "attempt-2", order)
        result = compare_stopped(clean, [first, second])
        assert result["attempts"][1]["resumed_at"] == 4, order
        assert (result["first_difference"], result["compared_steps"], result["unrecorded_steps"]) == (None, 12, [])
        timeless = [_without_times(b) for b in (clean_bytes, first_bytes, second_bytes)]
        written.append((*timeless, result["attempts"][1]["how"]))
    assert written[0] == written[1] == written[2]
    assert written[0][3] == "given" and b'{"resumed":4}' in written[0][2]  # said by the restart itself
