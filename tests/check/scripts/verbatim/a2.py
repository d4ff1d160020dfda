# Periodic checkpoints (every 16 steps) hold the weights and the step but NOT the generator (a bug).
# A SIGTERM handler writes a full "emergency" checkpoint (generator included) at the next step and exits 0.
# Resume after SIGTERM: exact. Resume from a periodic checkpoint (SIGKILL, OOM, node loss, KillWait): differs.
import json, os, signal, sys, time
import numpy as np
from reprocube import probe

SEED = int(os.environ.get("SEED", "0"))
TOTAL, EVERY = 96, 16
data = np.random.default_rng(1234)
X = data.normal(size=(256, 8)); y = X @ data.normal(size=8) + 0.1 * data.normal(size=256)
rng = np.random.default_rng(SEED)
w, step = np.zeros(8), 0
if os.path.exists("ckpt.npz"):
    c = np.load("ckpt.npz")
    w, step = c["w"].copy(), int(c["step"])
    if "rng" in c.files:
        rng.bit_generator.state = json.loads(str(c["rng"]))
    print(f"resumed at step {step} ({'with' if 'rng' in c.files else 'without'} generator)", flush=True)

def save(full):
    extra = {"rng": json.dumps(rng.bit_generator.state)} if full else {}
    np.savez("ckpt.tmp.npz", w=w, step=step, **extra)
    os.replace("ckpt.tmp.npz", "ckpt.npz")
    probe.checkpoint(step)

stop = []
signal.signal(signal.SIGTERM, lambda *a: stop.append(1))
while step < TOTAL:
    idx = rng.integers(0, 256, size=16)
    grad = 2 * X[idx].T @ (X[idx] @ w - y[idx]) / 16
    w = w - 0.02 * grad
    step += 1
    probe.step(np.mean((X[idx] @ w - y[idx]) ** 2), {"w": w}, step=step)
    if stop:
        save(full=True)
        print(f"SIGTERM: emergency checkpoint at step {step}", flush=True)
        sys.exit(0)
    if step % EVERY == 0:
        save(full=False)
        print(f"step {step} saved", flush=True)
    time.sleep(0.02)
np.savez("final.npz", w=w)
print("done", flush=True)
