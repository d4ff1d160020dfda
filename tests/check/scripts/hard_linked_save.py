"""A correct resume whose checkpoint is a hard link (round 6's b3): each save writes a numbered file, then
links ckpt.npz to it (link(2): a whole file put in place with no write of its own). The restart reads
ckpt.npz and continues from it: the weights, the step and the generator's state."""

import json
import os
import time

import numpy as np

from reprocube import probe

seed = int(os.environ.get("SEED", "0"))
data = np.random.default_rng(1234)
x = data.normal(size=(256, 8)).astype(np.float32)
y = (x @ data.normal(size=8) > 0).astype(np.float32)
rng, w, step = np.random.default_rng(seed), np.zeros(8, np.float32), 0
if os.path.exists("ckpt.npz"):
    with np.load("ckpt.npz") as checkpoint:
        w, step = checkpoint["w"], int(checkpoint["step"])
        rng.bit_generator.state = json.loads(str(checkpoint["rng"]))
    print(f"resumed at step {step}", flush=True)
while step < 96:
    batch = rng.choice(256, 32, replace=False)
    p = 1 / (1 + np.exp(-x[batch] @ w))
    w = w - np.float32(0.5) * (x[batch].T @ (p - y[batch]) / 32).astype(np.float32)
    step += 1
    probe.step(np.float32(np.mean(np.abs(p - y[batch]))), {"w": w}, step=step)
    time.sleep(0.03)
    if step % 16 == 0:
        os.makedirs("ckpts", exist_ok=True)
        numbered = f"ckpts/step-{step:06d}.npz"
        np.savez(numbered, w=w, step=step, rng=json.dumps(rng.bit_generator.state))
        if os.path.exists("ckpt.npz"):
            os.unlink("ckpt.npz")
        os.link(numbered, "ckpt.npz")
        probe.checkpoint(step)
        print(f"step {step} saved", flush=True)
np.savez("final.npz", w=w)
