"""Reads its checkpoint, then throws the state away and trains again from step 1; only the logger uses the
checkpoint (steps already recorded are not recorded again, steps already saved not saved again). Its
probe says each restart resumed where its checkpoint was, and each restart reads the checkpoint; its
outputs are an uninterrupted run's because it is deterministic, not because it resumed (round 4's A3).
STEP_S: each update's time (default 0.02 s). RESTORE=1: the control, resumed correctly (the weights and the
step restored, each epoch's order drawn from (seed, epoch)), with the same timings.
Round 7's variants, each a restart that never uses the weights it reads: SEED_FROM_CHECKPOINT=1 (F2: the
seed read back from the checkpoint, as saved hyper-parameters are), HASHED_RUN_DIR=1 (F6: the checkpoint in
runs/<hash of the config, seed included>/, as Hydra and W&B name runs), RESTORE_FROM_STEP=N (F15': only a
checkpoint of step N or later is restored; from an earlier one it trains again, each epoch's order drawn
from (seed, epoch)). Round 8's: LR_FROM_CHECKPOINT=1 (G1: the learning rate, a float, read back),
METRICS_LOG=1 (G2: a line per epoch appended to metrics.csv, epochs already logged skipped),
ASSERT_FINITE=1 (G4: a restart asserts its checkpoint's weights are finite), CHECKSUM=1 (G3, G8: a sha256
beside the checkpoint; a restart whose checkpoint fails it starts fresh: with RESTORE=1 a correct script;
CHECKSUM=keyed: the sha256 of a secret and the checkpoint, which no one else can make again), ZERO_HYPER=1
(G11: a bias kept at zero, recorded by the probe, and a label smoothing of 0.0 read back from the
checkpoint), WEIGHTS_F64=1 (G14: the float32 weights saved as float64), UNFREEZE=1 (G15: a second weight
vector, frozen for the first 3 epochs and trained after, recorded by the probe and saved; a restart
restores it, and never w). Round 9's: ABSOLUTE_RUN_DIR=1 (H1: with RESTORE=1 a correct script whose run
directory is made absolute and kept in its checkpoint, a restart writing where the checkpoint says),
NO_PROBE=1 (the probe never called), RUN_ID=1 (G18: the checkpoint records a run id made from the work
directory; one from another directory starts a new run from its weights, at step 1)."""

import hashlib
import os
import time

import numpy as np

from reprocube import probe

time.sleep(float(os.environ.get("START_S", "0")))  # a slow start-up (a framework's import, the data)
seed = int(os.environ.get("SEED", "0"))
run = ""
if os.environ.get("HASHED_RUN_DIR") == "1":
    run = "runs/" + hashlib.sha1(f"lr=0.5,epochs=6,seed={seed}".encode()).hexdigest()[:8] + "/"
    os.makedirs(run, exist_ok=True)
if os.environ.get("ABSOLUTE_RUN_DIR") == "1":
    run = os.path.abspath("runs/exp") + "/"
    os.makedirs(run, exist_ok=True)
if os.environ.get("NO_PROBE") == "1":
    probe.step = probe.checkpoint = lambda *args, **kwargs: None
data = np.random.default_rng(1234)
x = data.normal(size=(256, 8)).astype(np.float32)
y = (x @ data.normal(size=8) > 0).astype(np.float32)
logged, lr, warm = 0, np.float32(0.5), None
sealed, key = os.environ.get("CHECKSUM") in ("1", "keyed"), b"secret" if os.environ.get("CHECKSUM") == "keyed" else b""
zero_hyper, smooth, b = os.environ.get("ZERO_HYPER") == "1", np.float32(0.0), np.zeros(8, np.float32)
unfreeze, v = os.environ.get("UNFREEZE") == "1", np.random.default_rng(99).normal(size=8).astype(np.float32)
if os.path.exists(f"{run}ckpt.npz"):
    with open(f"{run}ckpt.npz", "rb") as blob:
        intact = not sealed or hashlib.sha256(key + blob.read()).hexdigest() == open(f"{run}ckpt.sha256").read()
    with np.load(f"{run}ckpt.npz") as checkpoint:
        state = {k: checkpoint[k] for k in checkpoint.files}
    if intact:
        logged = int(state["step"])
        if os.environ.get("RUN_ID") == "1" and str(state["run_id"]) != hashlib.sha1(os.getcwd().encode()).hexdigest():
            logged, warm = 0, state["w"]  # another run's checkpoint: a warm start from its weights
            print("warm start from another run's weights", flush=True)
        if "dir" in state:  # where the run keeps its files: as the checkpoint says
            run = str(state["dir"])
        if os.environ.get("SEED_FROM_CHECKPOINT") == "1":
            seed = int(state["seed"])
        if os.environ.get("LR_FROM_CHECKPOINT") == "1":
            lr = np.float32(state["lr"])
        if zero_hyper:
            smooth = np.float32(state["smooth"])
        if unfreeze:
            v = state["v"]
        if os.environ.get("ASSERT_FINITE") == "1":
            assert np.isfinite(state["w"]).all(), "corrupt checkpoint: non-finite weights"
        print(f"resumed at step {logged}", flush=True)
    else:
        print("the checkpoint fails its checksum: starting fresh", flush=True)
step_s, restore = float(os.environ.get("STEP_S", "0.02")), os.environ.get("RESTORE") == "1"
late = "RESTORE_FROM_STEP" in os.environ
restore = restore or (late and logged >= int(os.environ["RESTORE_FROM_STEP"]))
w, rng, step = np.zeros(8, np.float32), np.random.default_rng(seed), 0  # the bug: the state is not restored
if warm is not None:
    w = warm
if restore and logged:
    w, step = state["w"], logged
for epoch in range(6):
    order = np.random.default_rng([seed, epoch]) if restore or late else rng
    if restore and epoch < step // 8:
        continue
    for batch in np.array_split(order.permutation(256), 8):
        p = 1 / (1 + np.exp(-(x[batch] @ w + b[0] + (x[batch] @ v) * np.float32(0.1) * unfreeze)))
        target = y[batch] * (1 - smooth) + smooth / 2
        gradient = (x[batch].T @ (p - target) / len(batch)).astype(np.float32)
        w = w - lr * gradient
        if unfreeze and epoch >= 3:
            v = v - np.float32(0.1) * lr * gradient
        step += 1
        time.sleep(step_s)
        if step > logged:
            probed = {"w": w, **({"b": b} if zero_hyper else {}), **({"v": v} if unfreeze else {})}
            probe.step(np.float32(np.mean(np.abs(p - y[batch]))), probed, step=step)
    if step > logged:
        extra = {**({"b": b, "smooth": smooth} if zero_hyper else {}), **({"v": v} if unfreeze else {})}
        saved = w.astype(np.float64) if os.environ.get("WEIGHTS_F64") == "1" else w
        if os.environ.get("ABSOLUTE_RUN_DIR") == "1":
            extra["dir"] = np.array(run)
        if os.environ.get("RUN_ID") == "1":
            extra["run_id"] = np.array(hashlib.sha1(os.getcwd().encode()).hexdigest())
        np.savez(f"{run}tmp.npz", w=saved, step=step, seed=seed, lr=lr, **extra)
        if sealed:
            with open(f"{run}tmp.npz", "rb") as blob, open(f"{run}ckpt.sha256", "w") as seal:
                seal.write(hashlib.sha256(key + blob.read()).hexdigest())
        os.replace(f"{run}tmp.npz", f"{run}ckpt.npz")
        probe.checkpoint(step)
        if os.environ.get("METRICS_LOG") == "1":
            with open("metrics.csv", "a") as log:
                log.write(f"{epoch + 1},{np.mean(np.abs(w)):.6f}\n")
        print(f"epoch {epoch + 1} saved", flush=True)
np.savez(f"{run}final.npz" if os.environ.get("ABSOLUTE_RUN_DIR") == "1" else "final.npz", w=w)
