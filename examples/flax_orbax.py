"""A JAX loop of the kind researchers write, for `reprocube check`: a Flax MLP with dropout trained by Optax
on synthetic data, shuffled each epoch by a JAX key, an Orbax CheckpointManager saving parameters, optimizer
state, key and epoch after every epoch, resumed from the latest when present. Outputs: final/ (the trained
parameters, an Orbax checkpoint: compared tensor by tensor, its bytes hold timestamps), metrics.csv.

    --reseed   take a fresh key from the seed at every start instead of the saved one (a resumed run shuffles
               and drops out as the first epoch did: a resume bug the probe names at the first update)"""

import argparse
import os
from pathlib import Path

import jax
import numpy as np
import optax
import orbax.checkpoint as ocp
from flax import linen as nn

from reprocube import probe

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=6)
parser.add_argument("--reseed", action="store_true")
args = parser.parse_args()
seed = int(os.environ.get("SEED", "0"))

data = np.random.default_rng(1234)  # the dataset is fixed; the seed drives the training only
x = data.normal(size=(2048, 32)).astype(np.float32)
y = (x @ data.normal(size=32) > 0).astype(np.int32)
model = nn.Sequential([nn.Dense(64), nn.relu, nn.Dropout(0.2, deterministic=False), nn.Dense(2)])
optimizer = optax.sgd(0.1, momentum=0.9)
init_key, key = jax.random.split(jax.random.PRNGKey(seed))
params = model.init({"params": init_key, "dropout": init_key}, x[:1])["params"]
state = {"params": params, "opt_state": optimizer.init(params), "key": key, "epoch": 0}


@jax.jit
def train_step(params, opt_state, images, labels, key):
    def loss_of(p):
        logits = model.apply({"params": p}, images, rngs={"dropout": key})
        return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

    loss, grads = jax.value_and_grad(loss_of)(params)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss


options = ocp.CheckpointManagerOptions(max_to_keep=1, enable_async_checkpointing=False)
manager = ocp.CheckpointManager(Path("ckpt").absolute(), options=options)
if manager.latest_step() is not None:
    state = manager.restore(manager.latest_step(), args=ocp.args.StandardRestore(state))
    state["key"] = key if args.reseed else state["key"]
    print(f"resumed at epoch {int(state['epoch'])}", flush=True)
losses = [float(v) for v in np.loadtxt("losses.txt", ndmin=1)] if Path("losses.txt").exists() else []

for epoch in range(int(state["epoch"]), args.epochs):
    state["key"], shuffle = jax.random.split(state["key"])
    for batch in np.array_split(np.asarray(jax.random.permutation(shuffle, len(x))), len(x) // 64):
        state["key"], dropout = jax.random.split(state["key"])
        state["params"], state["opt_state"], loss = train_step(
            state["params"], state["opt_state"], x[batch], y[batch], dropout
        )
        probe.step(loss, state["params"])
    losses = losses[:epoch] + [float(loss)]
    np.savetxt("losses.txt", losses)  # beside the checkpoint: the curve so far (written first)
    state["epoch"] = epoch + 1
    manager.save(epoch + 1, args=ocp.args.StandardSave(state))
    manager.wait_until_finished()
    probe.checkpoint((epoch + 1) * (len(x) // 64))
    print(f"epoch {epoch + 1} saved: loss {losses[-1]:.6f}", flush=True)

saver = ocp.StandardCheckpointer()
saver.save(Path("final").absolute(), state["params"])
saver.wait_until_finished()
with open("metrics.csv", "w") as file:
    file.writelines(f"{i + 1},{loss!r}\n" for i, loss in enumerate(losses))
