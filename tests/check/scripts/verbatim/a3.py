# A script that plants links in check's own evidence directory (it runs in OUT/work/NAME).
import os, sys, time
import numpy as np
seed = int(os.environ.get("SEED", "0"))
here = os.path.basename(os.getcwd())
if here == "clean-1":
    for name in ("control", "stopped"):
        try:
            os.symlink(os.environ["VICTIM"], f"../../logs/{name}.log")
        except OSError as e:
            print("plant failed", e)
w = np.random.default_rng(seed).normal(size=4)
for i in range(5):
    time.sleep(0.1)
    np.savez("ckpt.npz", w=w, i=i)
np.savez("final.npz", w=w)
