"""A PyTorch training loop of the kind researchers write, for `reprocube check`: an MLP with dropout on
synthetic data, shuffled each epoch, `torch.save` of model and optimizer after every epoch, resumed from
the last one when present. Outputs: model.pt (the trained weights), metrics.csv. The two probe calls let
`reprocube check` name the first step a resumed run departs at (they do nothing outside check).

    --save-rng   also save and restore torch's generator (without it, a resumed run shuffles and drops out
                 differently from the uninterrupted one: a resume bug that no loss curve shows at a glance)"""

import argparse
import os

import torch

from reprocube import probe

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=6)
parser.add_argument("--save-rng", action="store_true")
args = parser.parse_args()
torch.manual_seed(int(os.environ.get("SEED", "0")))
torch.use_deterministic_algorithms(True)
torch.set_num_threads(1)

data = torch.Generator().manual_seed(1234)  # the dataset is fixed; the seed drives the training only
x = torch.randn(2048, 32, generator=data)
y = (x @ torch.randn(32, generator=data) > 0).long()
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Dropout(0.2), torch.nn.Linear(64, 2))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
start, losses = 0, []

if os.path.exists("ckpt.pt"):
    state = torch.load("ckpt.pt", weights_only=True)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    start, losses = state["epoch"], state["losses"]
    if "rng" in state:
        torch.set_rng_state(state["rng"])
    print(f"resumed at epoch {start}", flush=True)

for epoch in range(start, args.epochs):
    model.train()
    for batch in torch.randperm(len(x)).split(64):
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x[batch]), y[batch])
        loss.backward()
        optimizer.step()
        probe.step(loss, model)
    losses.append(loss.item())
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch + 1, "losses": losses}
    if args.save_rng:
        state["rng"] = torch.get_rng_state()
    torch.save(state, "ckpt.pt")
    probe.checkpoint((epoch + 1) * (len(x) // 64))
    print(f"epoch {epoch + 1} saved: loss {losses[-1]:.6f}", flush=True)

torch.save(model.state_dict(), "model.pt")
with open("metrics.csv", "w") as file:
    file.writelines(f"{i + 1},{loss!r}\n" for i, loss in enumerate(losses))
