"""Round 10: keeps its checkpoint (a pickle: no moved-weights restart can move it) in a folder named by a hash
of its seed, reads the step from it and trains the updates before it again from the start (a replay: the
weights it read are never used). The swapped restart paired the control's files with the uninterrupted
run's by their names, found none (the hashes differ), placed nothing, and the replay passed. Deterministic:
the truth is that a restart never continues from the state it reads."""

import hashlib
import os
import pickle
import time

import numpy as np

from reprocube import probe

seed = int(os.environ.get("SEED", "0"))
run = "runs/" + hashlib.sha1(f"seed={seed}".encode()).hexdigest()[:8]
os.makedirs(run, exist_ok=True)
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
if os.path.exists(f"{run}/ckpt.pkl"):
    with open(f"{run}/ckpt.pkl", "rb") as file:
        start = pickle.load(file)["step"]  # the weights saved beside it are never read back
    for step in range(1, start + 1):  # the replay, unrecorded
        w, _ = update(w, step)
    print(f"resumed at {start}", flush=True)
for step in range(start + 1, STEPS + 1):
    time.sleep(0.15)
    w, loss = update(w, step)
    probe.step(loss, {"w": w}, step=step)
    with open(f"{run}/ckpt.tmp", "wb") as file:
        pickle.dump({"w": w, "step": step}, file)
    os.replace(f"{run}/ckpt.tmp", f"{run}/ckpt.pkl")
    probe.checkpoint(step)
    print(f"step {step} saved", flush=True)
np.savez("final.npz", w=w)
