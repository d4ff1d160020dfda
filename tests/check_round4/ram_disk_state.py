"""Round 7's F1: a fast checkpoint on a RAM disk beside a disk checkpoint. ckpt.npz (the weights, the epoch,
the losses) lacks the generator's state (the bug); the full state is also pickled to /dev/shm, named after
the work directory. A restart on the same machine takes its state from /dev/shm and resumes bit for bit;
one elsewhere (another node, after a reboot) has only ckpt.npz and does not. SHM_DIR: where the fast
checkpoint goes (default /dev/shm)."""

import hashlib
import os
import pickle
import time

import numpy as np

from reprocube import probe

seed = int(os.environ.get("SEED", "0"))
fast = os.path.join(
    os.environ.get("SHM_DIR", "/dev/shm"), "reprocube-test-" + hashlib.sha1(os.getcwd().encode()).hexdigest()[:16]
)
data = np.random.default_rng(1234)
x = data.normal(size=(512, 16)).astype(np.float32)
y = (x @ data.normal(size=16) > 0).astype(np.float32)
w, start, losses, rng = np.zeros(16, np.float32), 0, [], np.random.default_rng(seed)
if os.path.exists("ckpt.npz"):
    with np.load("ckpt.npz") as checkpoint:
        w, start, losses = checkpoint["w"], int(checkpoint["epoch"]), [float(v) for v in checkpoint["losses"]]
    if os.path.exists(fast):
        with open(fast, "rb") as f:
            state = pickle.load(f)  # the test's own file
        if state["epoch"] == start:
            w, rng.bit_generator.state, losses = state["w"], state["rng"], state["losses"]
    print(f"resumed at epoch {start}", flush=True)
for epoch in range(start, 8):
    order = rng.permutation(len(x))
    for batch in np.array_split(order, 16):
        keep = (rng.random(16) > 0.1).astype(np.float32)
        p = 1 / (1 + np.exp(-(x[batch] * keep) @ w))
        w = w - np.float32(0.5) * ((x[batch] * keep).T @ (p - y[batch]) / len(batch)).astype(np.float32)
        probe.step(np.mean(np.abs(p - y[batch])), {"w": w})
    p = 1 / (1 + np.exp(-x @ w))
    losses.append(float(-np.mean(y * np.log(p + 1e-7) + (1 - y) * np.log(1 - p + 1e-7))))
    time.sleep(0.25)
    with open(fast + ".tmp", "wb") as f:
        pickle.dump({"w": w, "epoch": epoch + 1, "rng": rng.bit_generator.state, "losses": list(losses)}, f)
    os.replace(fast + ".tmp", fast)
    np.savez("ckpt.tmp.npz", w=w, epoch=epoch + 1, losses=np.array(losses))
    os.replace("ckpt.tmp.npz", "ckpt.npz")
    probe.checkpoint((epoch + 1) * 16)
    print(f"epoch {epoch + 1} saved", flush=True)
np.savez("final.npz", w=w)
if os.path.exists(fast):
    os.remove(fast)
