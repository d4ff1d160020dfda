"""A resume that is exact after an epoch's end and not after a mid-epoch save (Keras's BackupAndRestore with
save_freq, Lightning's loader without its state): a checkpoint after every batch (weights, the step, written
then renamed), 3 epochs of 3 batches; a restart restores the weights and the step but begins the epoch it
resumes in again at its first batch. After a save at an epoch's end it continues exactly; after a mid-epoch
save it trains that epoch's first batches twice (and makes more updates than an uninterrupted run).
`check --sweep` answers, a line per save, what the test's own stopped runs show.

Prints "saved N" after each checkpoint. Output: final.npy."""

import json
import os
import time

import numpy as np

from reprocube import probe

BATCHES, EPOCHS = 3, 3
data = np.random.default_rng(1234)
x = data.normal(size=(BATCHES, 8, 4)).astype(np.float32)
y = (x.sum(axis=2) > 0).astype(np.float32)
w, step = np.zeros(4, np.float32), 0
if os.path.exists("ckpt.json"):
    with open("ckpt.json") as f:
        saved = json.load(f)
    w, step = np.array(saved["w"], np.float32), saved["step"]
    probe.resumed(step)
    print(f"resumed at step {step}", flush=True)
start_epoch = step // BATCHES  # the bug: the epoch begins again at its first batch, wherever it was saved
for _epoch in range(start_epoch, EPOCHS):
    for batch in range(BATCHES):
        p = 1 / (1 + np.exp(-x[batch] @ w))
        w = (w - 0.5 * x[batch].T @ (p - y[batch]) / len(p)).astype(np.float32)
        step += 1
        loss = float(np.mean((p - y[batch]) ** 2))
        probe.step(np.float32(loss), {"w": w}, step=step)
        time.sleep(0.15)  # the time between two saves a stop lands in
        with open("ckpt.tmp", "w") as f:
            json.dump({"w": w.tolist(), "step": step}, f)
        os.replace("ckpt.tmp", "ckpt.json")
        probe.checkpoint(step)
        print(f"saved {step}", flush=True)
np.save("final.npy", w)
os.remove("ckpt.json")
