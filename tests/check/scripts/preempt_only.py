"""A correct resume that saves only when SIGTERM comes (round 7's F8, a SLURM requeue's preemption): the
handler sets a flag, the step ends, the state (weights, step, generator) goes to preempt.npz and the script
exits; a restart resumes from it and removes it. check said state-leaked ('saved no state file ... resumed
from state elsewhere'); the docs promise that such a save is named, not failed."""

import json
import os
import signal
import sys
import time

import numpy as np

from reprocube import probe

seed = int(os.environ.get("SEED", "0"))
data = np.random.default_rng(1234)
x = data.normal(size=(512, 16)).astype(np.float32)
y = (x @ data.normal(size=16) > 0).astype(np.float32)
w, step, rng = np.zeros(16, np.float32), 0, np.random.default_rng(seed)
stop = False


def on_term(*_):
    global stop
    stop = True


signal.signal(signal.SIGTERM, on_term)
if os.path.exists("preempt.npz"):
    with np.load("preempt.npz") as c:
        w, step = c["w"], int(c["step"])
        rng.bit_generator.state = json.loads(str(c["rng"]))
    os.remove("preempt.npz")
    probe.resumed(step)
    print(f"resumed at step {step}", flush=True)
while step < 128:
    batch = rng.choice(len(x), 32, replace=False)
    keep = (rng.random(16) > 0.1).astype(np.float32)
    p = 1 / (1 + np.exp(-(x[batch] * keep) @ w))
    w = w - np.float32(0.5) * ((x[batch] * keep).T @ (p - y[batch]) / len(batch)).astype(np.float32)
    step += 1
    probe.step(np.mean(np.abs(p - y[batch])), {"w": w}, step=step)
    time.sleep(0.02)
    if step % 16 == 0:
        print(f"step {step} done", flush=True)
    if stop:
        np.savez("preempt.tmp.npz", w=w, step=step, rng=np.array(json.dumps(rng.bit_generator.state)))
        os.replace("preempt.tmp.npz", "preempt.npz")
        probe.checkpoint(step)
        print(f"preempted: saved at step {step}", flush=True)
        sys.exit(0)
np.savez("final.npz", w=w)
