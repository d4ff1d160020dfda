"""A training loop on Hugging Face Accelerate, resuming the way its documentation shows, for
`reprocube check`: an MLP with dropout on synthetic data, shuffled by the DataLoader, `accelerator.save_state(dir)`
every `--save-steps` updates (checkpoints/step-N: model, optimizer, RNG states), and on a restart
`accelerator.load_state(dir)` of the newest then `accelerator.skip_first_batches` for the batches of the
resumed epoch already trained. SIGTERM is left to Python's default: the process dies. Outputs:
model.safetensors. The probe's two calls (Accelerate owns no loop: the script does) record every update and
each checkpoint; they do nothing outside check. What check finds here is in docs/frameworks.md.

    --save-steps N       a checkpoint every N updates (an epoch is 16)
    --seedable-sampler   DataLoaderConfiguration(use_seedable_sampler=True): each epoch's order from the seed
                         and the epoch (set_epoch), not from the generator's state when the epoch begins
    --rng-after-fetch    resumed mid-epoch, the restored generator state set again once the resumed epoch's
                         first batch is fetched (starting the loader's iterator draws from torch's generator; the
                         Trainer of transformers does the same after skipping); at an epoch's end not (set again
                         there, it undid the next epoch's draw: resume-differs at step 17)
    --device cuda        on the GPU (the Accelerator's device), with deterministic algorithms and cuBLAS's
                         workspace setting, as PyTorch documents for reproducibility
    --pause S            seconds it idles after announcing each save (default 0.3: a real step's time, so that a
                         stop sent as the line is read lands before the next update, as it would in a long run)"""

import argparse
import os
import time

import torch
from accelerate import Accelerator
from accelerate.utils import DataLoaderConfiguration, set_seed
from safetensors.torch import save_file

from reprocube import probe

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--save-steps", type=int, default=8)
parser.add_argument("--seedable-sampler", action="store_true")
parser.add_argument("--rng-after-fetch", action="store_true")
parser.add_argument("--pause", type=float, default=0.3)
parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
args = parser.parse_args()
torch.set_num_threads(1)
if args.device == "cuda":
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # before cuBLAS starts
    torch.use_deterministic_algorithms(True)

data = torch.Generator().manual_seed(1234)  # the dataset is fixed; the seed drives the training only
x = torch.randn(1024, 32, generator=data)
y = (x @ torch.randn(32, generator=data) > 0).long()


class Progress:  # the global step, saved and restored with the checkpoint (register_for_checkpointing)
    step = 0

    def state_dict(self):
        return {"step": self.step}

    def load_state_dict(self, state):
        self.step = state["step"]


# (automatic_checkpoint_naming is no help here: a restart does not restore its count and refuses to save)
accelerator = Accelerator(
    cpu=args.device == "cpu", dataloader_config=DataLoaderConfiguration(use_seedable_sampler=args.seedable_sampler)
)
set_seed(int(os.environ.get("SEED", "0")))
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Dropout(0.2), torch.nn.Linear(64, 2))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=64, shuffle=True)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
progress = Progress()
accelerator.register_for_checkpointing(progress)

saved = sorted(os.listdir("checkpoints")) if os.path.isdir("checkpoints") else []
restored_rng = None
if saved:
    accelerator.load_state(os.path.join("checkpoints", saved[-1]))  # model, optimizer, RNG states, progress
    # Mid-epoch only: at an epoch's end the next epoch's iterator draws from the restored generator, as the
    # uninterrupted run's did, and setting it again after the fetch would undo that draw.
    mid_epoch = progress.step % len(loader) != 0
    restored_rng = torch.get_rng_state() if args.rng_after_fetch and mid_epoch else None
    probe.resumed(progress.step)
    print(f"resumed at step {progress.step}", flush=True)
start_epoch, done_in_epoch = divmod(progress.step, len(loader))

for epoch in range(start_epoch, args.epochs):
    loader.set_epoch(epoch)
    batches = accelerator.skip_first_batches(loader, done_in_epoch) if epoch == start_epoch else loader
    model.train()
    for inputs, targets in batches:
        if restored_rng is not None:  # the first batch is fetched: the generator as the checkpoint had it
            torch.set_rng_state(restored_rng)
            restored_rng = None
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(inputs), targets)
        accelerator.backward(loss)
        optimizer.step()
        progress.step += 1
        probe.step(loss, model, step=progress.step)
        if progress.step % args.save_steps == 0:
            accelerator.save_state(f"checkpoints/step-{progress.step:06d}")
            probe.checkpoint(progress.step)
            print(f"step {progress.step} saved", flush=True)
            time.sleep(args.pause)

state = accelerator.unwrap_model(model).state_dict()
save_file({name: tensor.contiguous().cpu() for name, tensor in state.items()}, "model.safetensors")
