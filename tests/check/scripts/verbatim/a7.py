# A correct, exactly resuming script (weights, step, epoch, generator in ckpt.npz each epoch) that appends one
# line per step to metrics.csv (open, write, close: as csv loggers do); the restart truncates metrics.csv to
# the checkpoint's step so that it holds each step once.
import json, os, time
import numpy as np
from reprocube import probe

SEED = int(os.environ.get("SEED", "0"))
EPOCHS, STEPS = 6, 16
data = np.random.default_rng(1234)
X = data.normal(size=(256, 8)); y = X @ data.normal(size=8) + 0.1 * data.normal(size=256)
rng = np.random.default_rng(SEED)
w, step, start = np.zeros(8), 0, 1
if os.path.exists("ckpt.npz"):
    c = np.load("ckpt.npz")
    w, step, start = c["w"].copy(), int(c["step"]), int(c["epoch"]) + 1
    rng.bit_generator.state = json.loads(str(c["rng"]))
    print(f"resumed at epoch {start - 1}", flush=True)
    probe.resumed(step)
    lines = open("metrics.csv").read().splitlines()[: step + 1]
    open("metrics.csv", "w").write("\n".join(lines) + "\n")
else:
    open("metrics.csv", "w").write("step,loss\n")
for epoch in range(start, EPOCHS + 1):
    order = rng.permutation(256)
    for b in range(STEPS):
        idx = order[b * 16:(b + 1) * 16]
        w = w - 0.01 * 2 * X[idx].T @ (X[idx] @ w - y[idx]) / 16
        step += 1
        loss = np.mean((X[idx] @ w - y[idx]) ** 2)
        probe.step(loss, {"w": w}, step=step)
        with open("metrics.csv", "a") as f:
            f.write(f"{step},{loss!r}\n")
        time.sleep(0.02)
    np.savez("ckpt.tmp.npz", w=w, step=step, epoch=epoch, rng=json.dumps(rng.bit_generator.state))
    os.replace("ckpt.tmp.npz", "ckpt.npz")
    probe.checkpoint(step)
    print(f"epoch {epoch} saved", flush=True)
np.savez("final.npz", w=w)
print("done", flush=True)
