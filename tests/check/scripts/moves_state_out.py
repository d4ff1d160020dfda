"""Round 6's a8b: makes ckpts/ in its work directory, then moves it outside (OUTSIDE/<a hash of the work
directory>) and saves and resumes there, correctly. The watch on ckpts/ followed the moved directory and
named the saves and reads outside as the run's own: it resumes from state outside its directories, and
check must not pass it (state-leaked where the probe shows the resume)."""

import hashlib
import os
import time

import numpy as np

from reprocube import probe

seed = int(os.environ.get("SEED", "0"))
outside = os.path.join(os.environ["OUTSIDE"], hashlib.sha256(os.getcwd().encode()).hexdigest()[:12])
if not os.path.isdir(outside):
    os.makedirs("ckpts", exist_ok=True)
    time.sleep(0.5)  # long enough for check's watch on the new directory
    os.makedirs(os.environ["OUTSIDE"], exist_ok=True)
    os.rename("ckpts", outside)
data = np.random.default_rng(1234)
x = data.normal(size=(256, 8)).astype(np.float32)
y = (x @ data.normal(size=8) > 0).astype(np.float32)
w, step = np.zeros(8, np.float32), 0
checkpoint = os.path.join(outside, "ckpt.npz")
if os.path.exists(checkpoint):
    with np.load(checkpoint) as saved:
        w, step = saved["w"], int(saved["step"])
    probe.resumed(step)
    print(f"resumed at step {step}", flush=True)
for epoch in range(step // 8, 6):
    for batch in np.array_split(np.random.default_rng([seed, epoch]).permutation(256), 8):
        p = 1 / (1 + np.exp(-x[batch] @ w))
        w = w - np.float32(0.5) * (x[batch].T @ (p - y[batch]) / len(batch)).astype(np.float32)
        step += 1
        time.sleep(0.02)
        probe.step(np.float32(np.mean(np.abs(p - y[batch]))), {"w": w}, step=step)
    np.savez(os.path.join(outside, "tmp.npz"), w=w, step=step)
    os.replace(os.path.join(outside, "tmp.npz"), checkpoint)
    probe.checkpoint(step)
    print(f"epoch {epoch + 1} saved", flush=True)
np.savez("final.npz", w=w)
