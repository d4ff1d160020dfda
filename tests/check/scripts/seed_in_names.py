"""A correct resume whose checkpoint's path holds the seed (runs/seed0/ckpt.npz): the swapped restart must
place the control's runs/seed1/ckpt.npz where this run looks for its own, or it would wrongly say the
restart ignores the state it finds. WEIGHTS_AS_TEXT=1: the weights saved as JSON text (no tensor check can
move: the poisoned restarts cannot run, and the swapped restart is what tells)."""

import json
import os
import time

import numpy as np

from reprocube import probe

seed = int(os.environ.get("SEED", "0"))
run = f"runs/seed{seed}"
os.makedirs(run, exist_ok=True)
data = np.random.default_rng(1234)
x = data.normal(size=(256, 8)).astype(np.float32)
y = (x @ data.normal(size=8) > 0).astype(np.float32)
w, step, rng = np.zeros(8, np.float32), 0, np.random.default_rng(seed)
if os.path.exists(f"{run}/ckpt.npz"):
    with np.load(f"{run}/ckpt.npz") as checkpoint:
        w, step = checkpoint["w"], int(checkpoint["step"])
        if w.dtype.kind == "U":
            w = np.array(json.loads(str(w)), np.float32)
        rng.bit_generator.state = json.loads(str(checkpoint["rng"]))
    probe.resumed(step)
while step < 48:
    for batch in np.array_split(rng.permutation(256), 8):
        p = 1 / (1 + np.exp(-x[batch] @ w))
        w = w - np.float32(0.5) * (x[batch].T @ (p - y[batch]) / len(batch)).astype(np.float32)
        step += 1
        time.sleep(0.02)
        probe.step(np.float32(np.mean(np.abs(p - y[batch]))), {"w": w}, step=step)
    saved = np.array(json.dumps(w.tolist())) if os.environ.get("WEIGHTS_AS_TEXT") == "1" else w
    np.savez(f"{run}/tmp.npz", w=saved, step=step, rng=np.array(json.dumps(rng.bit_generator.state)))
    os.replace(f"{run}/tmp.npz", f"{run}/ckpt.npz")
    probe.checkpoint(step)
    print(f"saved {step}", flush=True)
np.savez("final.npz", w=w)
