"""A correct resume that logs each step's loss to SQLite (round 6's b14): metrics.db is kept open and written
in place, so the kernel closes it, a write to inotify, as the process ends, after a stop's signal. The
state is ckpt.npz, saved every 16 steps before the signal; the restart reads both."""

import json
import os
import sqlite3
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
db = sqlite3.connect("metrics.db")
db.execute("create table if not exists loss (step integer primary key, value real)")
db.execute("delete from loss where step > ?", (step,))
db.commit()
while step < 96:
    batch = rng.choice(256, 32, replace=False)
    p = 1 / (1 + np.exp(-x[batch] @ w))
    w = w - np.float32(0.5) * (x[batch].T @ (p - y[batch]) / 32).astype(np.float32)
    step += 1
    probe.step(np.float32(np.mean(np.abs(p - y[batch]))), {"w": w}, step=step)
    db.execute("insert into loss values (?, ?)", (step, float(np.mean(np.abs(p - y[batch])))))
    db.commit()
    time.sleep(0.03)
    if step % 16 == 0:
        os.makedirs("ckpts", exist_ok=True)
        np.savez("tmp.npz", w=w, step=step, rng=json.dumps(rng.bit_generator.state))
        os.replace("tmp.npz", "ckpt.npz")
        probe.checkpoint(step)
        print(f"step {step} saved", flush=True)
        time.sleep(0.1)  # no transaction open as an --at-line stop's signal comes (a hot journal is written then)
np.savez("final.npz", w=w)
