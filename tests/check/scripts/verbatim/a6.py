# A correct, exactly resuming script whose checkpoint directory is given as an absolute path on the command
# line (--ckpt-dir /scratch/...), as on a cluster; it removes its checkpoint when training completes.
import json, os, sys, time
import numpy as np
from reprocube import probe

SEED = int(os.environ.get("SEED", "0"))
CK = sys.argv[sys.argv.index("--ckpt-dir") + 1]
os.makedirs(CK, exist_ok=True)
path = os.path.join(CK, "ckpt.npz")
EPOCHS, STEPS = 6, 16
data = np.random.default_rng(1234)
X = data.normal(size=(256, 8)); y = X @ data.normal(size=8) + 0.1 * data.normal(size=256)
rng = np.random.default_rng(SEED)
w, step, start = np.zeros(8), 0, 1
if os.path.exists(path):
    c = np.load(path)
    w, step, start = c["w"].copy(), int(c["step"]), int(c["epoch"]) + 1
    rng.bit_generator.state = json.loads(str(c["rng"]))
    print(f"resumed at epoch {start - 1}", flush=True)
    probe.resumed(step)
for epoch in range(start, EPOCHS + 1):
    order = rng.permutation(256)
    for b in range(STEPS):
        idx = order[b * 16:(b + 1) * 16]
        w = w - 0.01 * 2 * X[idx].T @ (X[idx] @ w - y[idx]) / 16
        step += 1
        probe.step(np.mean((X[idx] @ w - y[idx]) ** 2), {"w": w}, step=step)
        time.sleep(0.02)
    np.savez(path + ".tmp.npz", w=w, step=step, epoch=epoch, rng=json.dumps(rng.bit_generator.state))
    os.replace(path + ".tmp.npz", path)
    probe.checkpoint(step)
    print(f"epoch {epoch} saved", flush=True)
np.savez("final.npz", w=w)
os.remove(path)
print("done", flush=True)
