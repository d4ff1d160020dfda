# F6 (round 4): on SIGTERM, a "graceful shutdown" that hangs (waits for a writer that never comes),
# ignoring further signals.
import os
import signal
import time

import numpy as np


def on_term(*_):
    print("term: waiting for the writer", flush=True)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    time.sleep(300)


signal.signal(signal.SIGTERM, on_term)
w = np.random.default_rng(int(os.environ.get("SEED", "0"))).normal(size=4)
for i in range(6):
    time.sleep(0.1)
    np.savez("ckpt.tmp.npz", w=w, i=i)
    os.replace("ckpt.tmp.npz", "ckpt.npz")
    print("saved", i, flush=True)
np.savez("final.npz", w=w)
