"""A PyTorch training loop of the kind researchers write, for `reprocube check`: an MLP with dropout on
synthetic data, shuffled each epoch, `torch.save` of model and optimizer after every epoch, resumed from
the last one when present. Outputs: model.pt (the trained weights), metrics.csv. The two probe calls let
`reprocube check` name the first step a resumed run departs at (they do nothing outside check).

    --save-rng   also save and restore torch's generators (without it, a resumed run shuffles and drops out
                 differently from the uninterrupted one: a resume bug that no loss curve shows at a glance)
    --hidden N   the hidden layer's width (64: a step of microseconds, start-up is most of a run; 4096: a
                 step of a few milliseconds, what benchmarks/check_cost.py times as a training-bound script)
    --device cuda  train on the GPU (deterministic: cuBLAS needs CUBLAS_WORKSPACE_CONFIG before CUDA starts)"""

import argparse
import os

import torch

from reprocube import probe

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=6)
parser.add_argument("--hidden", type=int, default=64)
parser.add_argument("--save-rng", action="store_true")
parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
args = parser.parse_args()
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # read when CUDA starts; without it cuBLAS raises
torch.manual_seed(int(os.environ.get("SEED", "0")))
torch.use_deterministic_algorithms(True)
torch.set_num_threads(1)

data = torch.Generator().manual_seed(1234)  # the dataset is fixed; the seed drives the training only
x = torch.randn(2048, 32, generator=data)
y = (x @ torch.randn(32, generator=data) > 0).long()
x, y = x.to(args.device), y.to(args.device)
model = torch.nn.Sequential(
    torch.nn.Linear(32, args.hidden),
    torch.nn.ReLU(),
    torch.nn.Dropout(0.2),
    torch.nn.Linear(args.hidden, 2),
)
model.to(args.device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
start, losses = 0, []

if os.path.exists("ckpt.pt"):
    state = torch.load("ckpt.pt", weights_only=True)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    start, losses = state["epoch"], state["losses"]
    if "rng" in state:
        torch.set_rng_state(state["rng"])
    if "cuda_rng" in state:
        torch.cuda.set_rng_state(state["cuda_rng"])
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
        if args.device == "cuda":  # dropout on the GPU draws from the CUDA generator
            state["cuda_rng"] = torch.cuda.get_rng_state()
    torch.save(state, "ckpt.pt.tmp")
    os.replace("ckpt.pt.tmp", "ckpt.pt")  # whole or not at all: a stop during the save leaves the last one
    probe.checkpoint((epoch + 1) * (len(x) // 64))
    print(f"epoch {epoch + 1} saved: loss {losses[-1]:.6f}", flush=True)

torch.save({name: tensor.cpu() for name, tensor in model.state_dict().items()}, "model.pt")
with open("metrics.csv", "w") as file:
    file.writelines(f"{i + 1},{loss!r}\n" for i, loss in enumerate(losses))
