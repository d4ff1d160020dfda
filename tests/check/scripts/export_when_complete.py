"""Round 6's a11e: a restart reads only the step from its checkpoint, trains a fresh model from step 1
without recording, and records and saves only past that step; a checkpoint already at the last step is
exported as the model ("already complete"). Its outputs are an uninterrupted run's because it is
deterministic, and the swapped restart, given the control's finished state, exports the control's weights
(other outputs, no claim). check cannot tell it from a resume: it must say what it did not check."""

import os
import time

import numpy as np

from reprocube import probe

seed = int(os.environ.get("SEED", "0"))
data = np.random.default_rng(1234)
x = data.normal(size=(256, 8)).astype(np.float32)
y = (x @ data.normal(size=8) > 0).astype(np.float32)
total, done = 80, 0
if os.path.exists("ckpt.npz"):
    with np.load("ckpt.npz") as checkpoint:
        state = {k: checkpoint[k] for k in checkpoint.files}
    done = int(state["step"])
    if done >= total:  # already complete: export
        np.savez("final.npz", w=state["w"])
        raise SystemExit(0)
w, rng, step = np.zeros(8, np.float32), np.random.default_rng(seed), 0  # the bug: the weights are not loaded
for epoch in range(10):
    for batch in np.array_split(rng.permutation(256), 8):
        p = 1 / (1 + np.exp(-x[batch] @ w))
        w = w - np.float32(0.5) * (x[batch].T @ (p - y[batch]) / len(batch)).astype(np.float32)
        step += 1
        time.sleep(0.01)
        if step > done:
            probe.step(np.float32(np.mean(np.abs(p - y[batch]))), {"w": w}, step=step)
    if step > done:
        np.savez("tmp.npz", w=w, step=step)
        os.replace("tmp.npz", "ckpt.npz")
        probe.checkpoint(step)
        print(f"epoch {epoch + 1} saved", flush=True)
np.savez("final.npz", w=w)
