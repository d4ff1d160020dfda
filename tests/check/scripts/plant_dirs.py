# F4 (round 4): run as clean-1, replaces check's own evidence directories (logs, probe, home, tmp) with
# symbolic links to directories outside --out (VICTIM), or plants a link where check makes one (PLANT:
# receipt, stopped, out). Deterministic, saves as it goes; no resume code.
import os
import time

import numpy as np

victim, plant = os.environ["VICTIM"], os.environ.get("PLANT", "dirs")
if os.path.basename(os.getcwd()) == "clean-1":
    if plant == "dirs":
        for d in ("logs", "probe", "home", "tmp"):
            os.rename(f"../../{d}", f"../../{d}.orig")
            os.symlink(f"{victim}/{d}", f"../../{d}")
    elif plant == "receipt":
        os.symlink(f"{victim}/receipt", "../../receipt")
    elif plant == "stopped":
        os.symlink(f"{victim}/work", "../stopped")
    elif plant == "out":
        out = os.path.abspath("../..")
        os.rename(out, out + ".orig")
        os.symlink(victim, out)
w = np.random.default_rng(int(os.environ.get("SEED", "0"))).normal(size=4)
for i in range(4):
    time.sleep(0.1)
    np.savez("ckpt.tmp.npz", w=w, i=i)
    os.replace("ckpt.tmp.npz", "ckpt.npz")
    print("saved", i, flush=True)
np.savez("final.npz", w=w)
