"""Keras 3 `model.fit` with the `BackupAndRestore` callback, the way Keras documents fault tolerance, for
`reprocube check`: a small classifier with dropout on synthetic data, shuffled by fit, backed up at every
epoch's end and resumed from the backup when the script starts again. Outputs: model.weights.h5,
history.csv. The probe's callback (its place in the list does not matter) records each update at the
optimizer's step and announces each backup, so check names the first update that departs. What check
finds here is in docs/check.md (measured, not assumed)."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import keras  # noqa: E402
import numpy as np  # noqa: E402

from reprocube import probe  # noqa: E402

keras.utils.set_random_seed(int(os.environ.get("SEED", "0")))
data = np.random.default_rng(1234)  # the dataset is fixed; the seed drives the training only
x = data.normal(size=(2048, 32)).astype("float32")
y = (x @ data.normal(size=32) > 0).astype("int64")

model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(64, activation="relu"), keras.layers.Dropout(0.2),
                          keras.layers.Dense(2)])  # fmt: skip
model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))  # fmt: skip


class Saved(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):  # after BackupAndRestore's own on_epoch_end (listed first)
        print(f"epoch {epoch + 1} saved: loss {logs['loss']:.6f}", flush=True)


history = model.fit(x, y, batch_size=64, epochs=6, verbose=0,
                    callbacks=[keras.callbacks.BackupAndRestore("backup"), probe.keras_callback(), Saved()])  # fmt: skip
model.save_weights("model.weights.h5")
with open("history.csv", "w") as file:
    file.writelines(f"{i + 1},{loss!r}\n" for i, loss in enumerate(history.history["loss"]))
