# Rank 0, probe.step at EVERY step, through the metrics logger. The resume code looks for the wrong file name
# (saves ckpt.npz, looks for checkpoint.npz: a typo), so every start trains from step 1. The logger, as loggers
# that feed W&B/TensorBoard do, appends to metrics.jsonl only steps it has not logged yet (W&B refuses a step
# that does not increase), and the probe is called there.
import json, os, time
import numpy as np
from reprocube import probe

SEED = int(os.environ.get("SEED", "0"))
EPOCHS, STEPS = 6, 16
rng = np.random.default_rng(SEED)
X = rng.normal(size=(256, 8)); y = X @ rng.normal(size=8) + 0.1 * rng.normal(size=256)
w, step, start_epoch = np.zeros(8), 0, 1
if os.path.exists("checkpoint.npz"):          # the bug: the checkpoint is saved as ckpt.npz
    c = np.load("checkpoint.npz", allow_pickle=False)
    w, step, start_epoch = c["w"].copy(), int(c["step"]), int(c["epoch"]) + 1
    rng.bit_generator.state = json.loads(str(c["rng"]))

last_logged = 0
if os.path.exists("metrics.jsonl"):
    with open("metrics.jsonl") as f:
        lines = [json.loads(l) for l in f if l.strip()]
    last_logged = lines[-1]["step"] if lines else 0

def log(step, loss, w):
    global last_logged
    if step <= last_logged:
        return                                   # already logged: W&B would refuse it
    probe.step(loss, {"w": w}, step=step)
    with open("metrics.jsonl", "a") as f:
        f.write(json.dumps({"step": step, "loss": float(loss)}) + "\n")
    last_logged = step

for epoch in range(start_epoch, EPOCHS + 1):
    order = rng.permutation(256)
    for b in range(STEPS):
        idx = order[b * 16:(b + 1) * 16]
        w = w - 0.01 * 2 * X[idx].T @ (X[idx] @ w - y[idx]) / 16
        step += 1
        log(step, np.mean((X[idx] @ w - y[idx]) ** 2), w)
        time.sleep(0.02)
    np.savez("ckpt.tmp.npz", w=w, step=step, epoch=epoch, rng=json.dumps(rng.bit_generator.state))
    os.replace("ckpt.tmp.npz", "ckpt.npz")
    probe.checkpoint(step)
    print(f"epoch {epoch} saved", flush=True)
np.savez("final.npz", w=w)
print("done", flush=True)
