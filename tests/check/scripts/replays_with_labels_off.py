"""Round 10: reads its step from its checkpoint, then trains the updates before it again from the start (a
replay: the weights it read are never used), and labels the updates it records one step early (its step
counter is not restored as it was). The old moved-weights restart set its first loss against the
uninterrupted run's update of the same label, another update, and said it used its weights. Deterministic,
its outputs an uninterrupted run's: the truth is that a restart never uses the weights it reads."""

import os
import time

import numpy as np

from reprocube import probe

seed = int(os.environ.get("SEED", "0"))
data = np.random.default_rng(1234)
x = data.normal(size=(256, 8)).astype(np.float32)
y = (x @ data.normal(size=8) > 0).astype(np.float32)
STEPS, lr = 8, np.float32(0.5)


def update(w, step):
    rng = np.random.default_rng([seed, step])
    batch = rng.choice(256, 32, replace=False)
    p = 1 / (1 + np.exp(-(x[batch] @ w)))
    return w - lr * x[batch].T @ (p - y[batch]) / 32, np.float32(np.mean(np.abs(p - y[batch])))


w, start = np.zeros(8, np.float32), 0
if os.path.exists("ckpt.npz"):
    with np.load("ckpt.npz") as checkpoint:
        start = int(checkpoint["step"])  # the weights saved beside it are never read back
    for step in range(1, start + 1):  # the replay, unrecorded
        w, _ = update(w, step)
    print(f"resumed at {start}", flush=True)
for step in range(start + 1, STEPS + 1):
    time.sleep(0.15)
    w, loss = update(w, step)
    probe.step(loss, {"w": w}, step=step - (1 if start else 0))  # off by one after a restart
    np.savez("ckpt.tmp.npz", w=w, step=np.int64(step))
    os.replace("ckpt.tmp.npz", "ckpt.npz")
    probe.checkpoint(step - (1 if start else 0))
    print(f"step {step} saved", flush=True)
np.savez("final.npz", w=w)
