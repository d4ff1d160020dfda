# A script that NEVER resumes (it has no load code: every start trains from step 1), but logs to the
# probe only every LOG_EVERY-th step with step=global_step (a logging interval, as loggers are called).
import os, sys, time
import numpy as np
from reprocube import probe

SEED = int(os.environ.get("SEED", "0"))
LOG_EVERY = int(os.environ.get("LOG_EVERY", "4"))
EPOCHS, STEPS = 6, 16
rng = np.random.default_rng(SEED)
X = rng.normal(size=(256, 8)); y = X @ rng.normal(size=8) + 0.1 * rng.normal(size=256)
w = np.zeros(8)
step = 0
for epoch in range(1, EPOCHS + 1):
    order = rng.permutation(256)
    for b in range(STEPS):
        idx = order[b * 16:(b + 1) * 16]
        grad = 2 * X[idx].T @ (X[idx] @ w - y[idx]) / 16
        w = w - 0.01 * grad
        step += 1
        loss = np.mean((X[idx] @ w - y[idx]) ** 2)
        if step % LOG_EVERY == 0:
            probe.step(loss, {"w": w}, step=step)
        time.sleep(0.02)
    np.savez("ckpt.tmp.npz", w=w, step=step)
    os.replace("ckpt.tmp.npz", "ckpt.npz")
    probe.checkpoint(step)
    print(f"epoch {epoch} saved", flush=True)
np.savez("final.npz", w=w)
print("done", flush=True)
