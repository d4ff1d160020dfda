"""Gradient accumulation over 4 micro-batches; on SIGTERM it does not lose the micro-batches it has: it
applies them as one partial update, records it, saves and exits. That update is not the uninterrupted
run's, so a stopped-and-rerun run differs; a SIGKILL at the same moment would not (its checkpoints every 4
updates are exact). Deterministic: the difference is the stop's doing, recorded after the signal (round 4's
G)."""

import json
import os
import signal
import sys
import time

import numpy as np

from reprocube import probe

stop = []
signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
seed = int(os.environ.get("SEED", "0"))
data = np.random.default_rng(1234)
x = data.normal(size=(256, 8)).astype(np.float32)
y = (x @ data.normal(size=8) > 0).astype(np.float32)
w, step, rng = np.zeros(8, np.float32), 0, np.random.default_rng(seed)


def save():
    np.savez("tmp.npz", w=w, step=step, rng=np.array(json.dumps(rng.bit_generator.state)))
    os.replace("tmp.npz", "ckpt.npz")
    probe.checkpoint(step)
    print(f"saved {step}", flush=True)


if os.path.exists("ckpt.npz"):
    with np.load("ckpt.npz") as checkpoint:
        w, step = checkpoint["w"], int(checkpoint["step"])
        rng.bit_generator.state = json.loads(str(checkpoint["rng"]))
    probe.resumed(step)
while step < 32:
    order = rng.permutation(256)[:32]
    grad, loss = np.zeros(8, np.float32), np.float32(0)
    for k, batch in enumerate(np.array_split(order, 4)):
        p = 1 / (1 + np.exp(-x[batch] @ w))
        grad += (x[batch].T @ (p - y[batch]) / len(batch)).astype(np.float32)
        loss += np.float32(np.mean(np.abs(p - y[batch])))
        print(f"micro {k + 1} of step {step + 1}", flush=True)
        # where the tests stop it (micro 2 of steps 7 and 19) a wider window: a signal sent late under load
        # (the suite's three workers on 2 CPUs) still lands before the step's last micro-batch
        time.sleep(0.4 if k == 1 and step + 1 in (7, 19) else 0.02)
        if stop:
            break
    w = w - np.float32(0.5) * grad / np.float32(k + 1)
    step += 1
    probe.step(loss / np.float32(k + 1), {"w": w}, step=step)
    if stop:
        save()
        sys.exit(0)
    if step % 4 == 0:
        save()
np.savez("final.npz", w=w)
