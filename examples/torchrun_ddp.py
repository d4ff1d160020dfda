"""Data-parallel training under `torchrun --nproc_per_node=2` (gloo, on the CPU), for `reprocube check`: an
MLP with dropout in DistributedDataParallel, a DistributedSampler with `set_epoch` (each epoch's order from
the sampler's seed and the epoch, the same on every rank), a checkpoint of the model and the optimizer by
rank 0 after every epoch (atomically), resumed from it when present. SIGTERM is left to torchrun: it ends
the workers and exits. Outputs: model.safetensors (rank 0). The probe's two calls on every rank write one
trace per rank (RANK from torchrun); they do nothing outside check.

    python -m torch.distributed.run --standalone --nproc_per_node=2 examples/torchrun_ddp.py [--save-rng]

    --save-rng   each rank also saves its own torch generator (dropout's) beside the checkpoint and restores
                 it: rank 1's as well as rank 0's
    --device cuda  each rank on its GPU (LOCAL_RANK) with NCCL, deterministic algorithms and cuBLAS's
                 workspace setting (PyTorch's reproducibility notes); its CUDA generator is the one saved
    --pause S    seconds it idles after announcing each save (default 0.3: a real step's time, so that a
                 stop sent as the line is read lands before the next update, as it would in a long run)"""

import argparse
import os
import time

import torch
import torch.distributed as dist
from safetensors.torch import save_file
from torch.nn.parallel import DistributedDataParallel

from reprocube import probe

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--save-rng", action="store_true")
parser.add_argument("--pause", type=float, default=0.3)
parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
args = parser.parse_args()
torch.set_num_threads(1)
if args.device == "cuda":
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # before cuBLAS starts
    torch.use_deterministic_algorithms(True)
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
device = torch.device(args.device, torch.cuda.current_device()) if args.device == "cuda" else torch.device("cpu")
generator = torch.cuda if args.device == "cuda" else torch  # the generator dropout draws from
dist.init_process_group("nccl" if args.device == "cuda" else "gloo")
rank = dist.get_rank()
seed = int(os.environ.get("SEED", "0"))

data = torch.Generator().manual_seed(1234)  # the dataset is fixed; the seed drives the training only
x = torch.randn(1024, 32, generator=data)
y = (x @ torch.randn(32, generator=data) > 0).long()
dataset = torch.utils.data.TensorDataset(x, y)
sampler = torch.utils.data.distributed.DistributedSampler(dataset, shuffle=True, seed=seed)
loader = torch.utils.data.DataLoader(dataset, batch_size=32, sampler=sampler)  # 16 updates an epoch

torch.manual_seed(seed)  # the same initial weights on every rank
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Dropout(0.2), torch.nn.Linear(64, 2))
model.to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
torch.manual_seed(seed * 1000 + rank)  # each rank's own dropout masks
start = 0
if os.path.exists("ckpt.pt"):
    state = torch.load("ckpt.pt", weights_only=True)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    start = state["epoch"]
    if os.path.exists(f"rng/{start}-{rank}.pt"):
        generator.set_rng_state(torch.load(f"rng/{start}-{rank}.pt", weights_only=True))
    probe.resumed(start * len(loader))
    print(f"rank {rank} resumed at epoch {start}", flush=True)
ddp = DistributedDataParallel(model, device_ids=[device.index] if args.device == "cuda" else None)

for epoch in range(start, args.epochs):
    sampler.set_epoch(epoch)
    for inputs, targets in loader:
        inputs, targets = inputs.to(device), targets.to(device)
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(ddp(inputs), targets)
        loss.backward()  # gradients averaged over both ranks
        optimizer.step()
        probe.step(loss, model)
    if args.save_rng:  # every rank's generator, under the epoch it belongs to
        os.makedirs("rng", exist_ok=True)
        torch.save(generator.get_rng_state(), f"rng/{epoch + 1}-{rank}.pt.tmp")
        os.replace(f"rng/{epoch + 1}-{rank}.pt.tmp", f"rng/{epoch + 1}-{rank}.pt")
    dist.barrier()
    if rank == 0:
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch + 1}, "ckpt.tmp")
        os.replace("ckpt.tmp", "ckpt.pt")  # the checkpoint is the epoch's once this is done
    dist.barrier()
    probe.checkpoint((epoch + 1) * len(loader))  # on every rank (each rank's trace is written up to here)
    dist.barrier()  # every rank has announced it before the line a stop may follow
    if rank == 0:
        print(f"epoch {epoch + 1} saved: loss {loss.item():.6f}", flush=True)
    time.sleep(args.pause)  # every rank

if rank == 0:
    save_file({name: tensor.contiguous() for name, tensor in model.state_dict().items()}, "model.safetensors")
dist.destroy_process_group()
