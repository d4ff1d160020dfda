"""Round 7's F1c: a checkpoint in the work directory without the generator's state (the bug), and the full
state kept beside the work directory ("../.NAME-fast.pkl", removed at the end). A restart on the same
machine takes its state from beside; on another machine it would not find it. check passed it resume-exact.
SHM_DIR=DIR: round 7's F1, the full state on a RAM disk instead (DIR/reprocube-test-<hash of the work
directory>, as in /dev/shm)."""

import hashlib
import os
import pickle
import time

import numpy as np

from reprocube import probe

seed = int(os.environ.get("SEED", "0"))
fast = os.path.join("..", "." + os.path.basename(os.getcwd()) + "-fast.pkl")  # beside the work directory
if "SHM_DIR" in os.environ:
    fast = os.path.join(os.environ["SHM_DIR"], "reprocube-test-" + hashlib.sha1(os.getcwd().encode()).hexdigest()[:16])
data = np.random.default_rng(1234)
x = data.normal(size=(512, 16)).astype(np.float32)
y = (x @ data.normal(size=16) > 0).astype(np.float32)
w, start, losses, rng = np.zeros(16, np.float32), 0, [], np.random.default_rng(seed)
if os.path.exists("ckpt.npz"):
    with np.load("ckpt.npz") as ckpt:
        w, start, losses = ckpt["w"], int(ckpt["epoch"]), [float(v) for v in ckpt["losses"]]
    if os.path.exists(fast):
        with open(fast, "rb") as f:
            st = pickle.load(f)
        if st["epoch"] == start:
            w, rng.bit_generator.state, losses = st["w"], st["rng"], st["losses"]
            print("fast resume from memory", flush=True)
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
    print(f"epoch {epoch + 1} saved: loss {losses[-1]:.6f}", flush=True)
np.savez("final.npz", w=w)
if os.path.exists(fast):
    os.remove(fast)
