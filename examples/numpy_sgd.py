"""A training script of the kind `reprocube check` tests, in NumPy alone (starts in a fraction of a second):
logistic regression by minibatch SGD on synthetic data, shuffled and with dropout noise from a seeded
generator, a checkpoint after every epoch, resumed from it when present. Outputs: final.npz, metrics.csv.

    --save-rng     the checkpoint holds the generator's state too (without it, a resumed run draws anew)
    --random-seed  seed from the clock: not deterministic at all
    --non-atomic   write the checkpoint in place, in pieces (a large checkpoint on slow storage)
    --from-scratch never resume: start again at epoch 1 after a stop (deterministic, so its outputs match;
                   only the probe's two calls tell check that nothing resumed)"""

import argparse
import json
import os
import time

import numpy as np

from reprocube import probe

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=8)
parser.add_argument("--sleep", type=float, default=0.25, help="seconds of 'work' per epoch")
parser.add_argument("--save-rng", action="store_true")
parser.add_argument("--random-seed", action="store_true")
parser.add_argument("--non-atomic", action="store_true")
parser.add_argument("--from-scratch", action="store_true")
args = parser.parse_args()
seed = time.time_ns() if args.random_seed else int(os.environ.get("SEED", "0"))

data = np.random.default_rng(1234)  # the dataset is fixed; the seed drives the training only
x = data.normal(size=(512, 16)).astype(np.float32)
y = (x @ data.normal(size=16) > 0).astype(np.float32)
w, start, losses, rng = np.zeros(16, np.float32), 0, [], np.random.default_rng(seed)

if os.path.exists("ckpt.npz") and not args.from_scratch:
    with np.load("ckpt.npz") as ckpt:
        w, start, losses = ckpt["w"], int(ckpt["epoch"]), [float(v) for v in ckpt["losses"]]
        if "rng" in ckpt.files:
            rng.bit_generator.state = json.loads(str(ckpt["rng"]))
    print(f"resumed at epoch {start}", flush=True)

for epoch in range(start, args.epochs):
    order = rng.permutation(len(x))
    for batch in np.array_split(order, 16):
        keep = (rng.random(16) > 0.1).astype(np.float32)  # dropout on the inputs' features
        p = 1 / (1 + np.exp(-(x[batch] * keep) @ w))
        w = w - np.float32(0.5) * ((x[batch] * keep).T @ (p - y[batch]) / len(batch)).astype(np.float32)
        probe.step(np.mean(np.abs(p - y[batch])), {"w": w})  # the batch's error before the update, the weights after
    p = 1 / (1 + np.exp(-x @ w))
    losses.append(float(-np.mean(y * np.log(p + 1e-7) + (1 - y) * np.log(1 - p + 1e-7))))
    time.sleep(args.sleep)
    state = {"w": w, "epoch": epoch + 1, "losses": np.array(losses)}
    if args.save_rng:
        state["rng"] = np.array(json.dumps(rng.bit_generator.state))
    if args.non_atomic:
        with open("ckpt.npz", "wb") as file:  # in place: a stop mid-write leaves half a file
            blob = __import__("io").BytesIO()
            np.savez(blob, **state)
            for i in range(0, len(blob.getvalue()), 256):
                file.write(blob.getvalue()[i : i + 256])
                file.flush()
                time.sleep(0.05)
    else:
        np.savez("ckpt.tmp.npz", **state)
        os.replace("ckpt.tmp.npz", "ckpt.npz")  # atomic: the old checkpoint or the whole new one
    probe.checkpoint((epoch + 1) * 16)
    print(f"epoch {epoch + 1} saved: loss {losses[-1]:.6f}", flush=True)

np.savez("final.npz", w=w)
with open("metrics.csv", "w") as file:
    file.writelines(f"{i + 1},{loss!r}\n" for i, loss in enumerate(losses))
