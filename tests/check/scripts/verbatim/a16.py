# A checkpoint every 2 epochs (5 epochs: after 2 and 4), exact (weights, step, epoch, generator). A SIGTERM
# handler makes the script write an emergency checkpoint at the end of the epoch, WITHOUT the generator (the bug) and exits 0; a
# restart from it draws a new generator. Prints without flush (Python's default when stdout is a pipe).
import json, os, signal, sys, time
import numpy as np
from reprocube import probe
SEED = int(os.environ.get("SEED", "0"))
EPOCHS, STEPS = 5, 16
data = np.random.default_rng(1234)
X = data.normal(size=(256, 8)); y = X @ data.normal(size=8) + 0.1 * data.normal(size=256)
rng = np.random.default_rng(SEED)
w, step, start = np.zeros(8), 0, 1
if os.path.exists("ckpt.npz"):
    c = np.load("ckpt.npz"); w, step, start = c["w"].copy(), int(c["step"]), int(c["epoch"]) + 1
    if "rng" in c.files:
        rng.bit_generator.state = json.loads(str(c["rng"]))
    else:
        rng = np.random.default_rng(SEED + 1000 * step)
    probe.resumed(step); print(f"resumed at step {step}")
def save(epoch, full):
    extra = {"rng": json.dumps(rng.bit_generator.state)} if full else {}
    np.savez("ckpt.tmp.npz", w=w, step=step, epoch=epoch, **extra); os.replace("ckpt.tmp.npz", "ckpt.npz")
    probe.checkpoint(step)
stop = []
signal.signal(signal.SIGTERM, lambda *a: stop.append(1))
for epoch in range(start, EPOCHS + 1):
    order = rng.permutation(256)
    for b in range(STEPS):
        idx = order[b * 16:(b + 1) * 16]
        w = w - 0.01 * 2 * X[idx].T @ (X[idx] @ w - y[idx]) / 16
        step += 1
        probe.step(np.mean((X[idx] @ w - y[idx]) ** 2), {"w": w}, step=step)
        time.sleep(0.02)
    if stop:   # the emergency save at the epoch's end, without the generator (the bug)
        save(epoch, full=False); print(f"SIGTERM: emergency checkpoint at epoch {epoch}"); sys.exit(0)
    if epoch % 2 == 0:
        save(epoch, full=True)
    print(f"epoch {epoch} done")
np.savez("final.npz", w=w)
