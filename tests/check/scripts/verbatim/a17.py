# A correct, exactly resuming script whose probe.step sits in a time-throttled logger (at most every 0.1 s,
# step=step), as progress loggers are.
import json, os, time
import numpy as np
from reprocube import probe

SEED = int(os.environ.get("SEED", "0"))
EPOCHS, STEPS = 6, 16
data = np.random.default_rng(1234)
X = data.normal(size=(256, 8)); y = X @ data.normal(size=8) + 0.1 * data.normal(size=256)
rng = np.random.default_rng(SEED)
w, step, start = np.zeros(8), 0, 1
last_log = 0.0
if os.path.exists("ckpt.npz"):
    c = np.load("ckpt.npz")
    w, step, start = c["w"].copy(), int(c["step"]), int(c["epoch"]) + 1
    rng.bit_generator.state = json.loads(str(c["rng"]))
    print(f"resumed at epoch {start - 1}", flush=True)
    probe.resumed(step)
else:
    pass
for epoch in range(start, EPOCHS + 1):
    order = rng.permutation(256)
    for b in range(STEPS):
        idx = order[b * 16:(b + 1) * 16]
        w = w - 0.01 * 2 * X[idx].T @ (X[idx] @ w - y[idx]) / 16
        step += 1
        loss = np.mean((X[idx] @ w - y[idx]) ** 2)
        if time.monotonic() - last_log >= 0.1:   # log at most every 0.1 s (a time-throttled logger)
            last_log = time.monotonic()
            probe.step(loss, {"w": w}, step=step)   # the probe called at the logging interval
        time.sleep(0.02)
    np.savez("ckpt.tmp.npz", w=w, step=step, epoch=epoch, rng=json.dumps(rng.bit_generator.state))
    os.replace("ckpt.tmp.npz", "ckpt.npz")
    probe.checkpoint(step)
    print(f"epoch {epoch} saved", flush=True)
np.savez("final.npz", w=w)
print("done", flush=True)
