"""Keras 3 `model.fit` with the `BackupAndRestore` callback, the way Keras documents fault tolerance, for
`reprocube check`: a small classifier with dropout on synthetic data, shuffled by fit, backed up at every
epoch's end and resumed from the backup when the script starts again. Outputs: model.weights.h5,
history.csv. The probe's callback (its place in the list does not matter) records each update at the
optimizer's step and announces each backup, so check names the first update that departs. What check
finds here is in docs/check.md and docs/frameworks.md (measured, not assumed). SIGTERM is left to Python's
default, as Keras leaves it: the process dies.

    --save-freq N   BackupAndRestore(save_freq=N): a backup every N updates (an epoch is 32), mid-epoch too
    --epoch-seeds   the fix: each epoch's shuffling and dropout drawn from (seed, epoch), set when the epoch
                    begins (EpochSeeds, 6 lines), not from how many epochs this process has run
    --pause S       seconds it idles after announcing each save (default 0.3: a real step's time, so that a
                    stop sent as the line is read lands before the next update, as it would in a long run)"""

import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import keras
import numpy as np

from reprocube import probe

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=6)
parser.add_argument("--save-freq", default="epoch", type=lambda text: text if text == "epoch" else int(text))
parser.add_argument("--epoch-seeds", action="store_true")
parser.add_argument("--pause", type=float, default=0.3)
args = parser.parse_args()
seed = int(os.environ.get("SEED", "0"))
keras.utils.set_random_seed(seed)
data = np.random.default_rng(1234)  # the dataset is fixed; the seed drives the training only
x = data.normal(size=(2048, 32)).astype("float32")
y = (x @ data.normal(size=32) > 0).astype("int64")

model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(64, activation="relu"), keras.layers.Dropout(0.2),
                          keras.layers.Dense(2)])  # fmt: skip
model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))  # fmt: skip


class Saved(keras.callbacks.Callback):  # listed after BackupAndRestore: its backup is written when these print
    def on_train_batch_end(self, batch, logs=None):
        if backup.save_freq != "epoch" and backup._batches_seen_since_last_saving == 0:  # it has just saved
            print(f"step {int(self.model.optimizer.iterations)} saved", flush=True)
            time.sleep(args.pause)

    def on_epoch_end(self, epoch, logs=None):
        if backup.save_freq == "epoch":
            print(f"epoch {epoch + 1} saved: loss {logs['loss']:.6f}", flush=True)
            time.sleep(args.pause)


class EpochSeeds(keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):  # before fit builds the epoch's shuffled dataset
        keras.utils.set_random_seed(seed * 100003 + epoch)
        for layer in self.model.layers:
            if hasattr(layer, "seed_generator"):  # dropout's generator: its state is in no backup
                layer.seed_generator.state.assign([seed * 100003 + epoch, 0])


backup = keras.callbacks.BackupAndRestore("backup", save_freq=args.save_freq)
callbacks = [backup, probe.keras_callback(), Saved()] + ([EpochSeeds()] if args.epoch_seeds else [])
history = model.fit(x, y, batch_size=64, epochs=args.epochs, verbose=0, callbacks=callbacks)
model.save_weights("model.weights.h5")
with open("history.csv", "w") as file:
    file.writelines(f"{i + 1},{loss!r}\n" for i, loss in enumerate(history.history["loss"]))
