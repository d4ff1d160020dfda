"""Lightning's `Trainer.fit(ckpt_path="last")`, the resume its documentation shows, for `reprocube check`:
an MLP with dropout on synthetic data, shuffled by the DataLoader, `ModelCheckpoint(every_n_train_steps=N,
save_last=True)`, and the same command resumes from checkpoints/last.ckpt when it is there. SIGTERM is left
to Lightning: its handler lets the batch finish and then ends the process (SIGTERMException). Outputs:
model.safetensors (the trained weights). The probe's callback records every update and announces every
checkpoint; it does nothing outside check. What check finds here is in docs/frameworks.md.

    --save-steps N      a checkpoint every N updates (an epoch is 16)
    --save-rng          the LightningModule saves torch's generator in the checkpoint and restores it
                        (on_save_checkpoint / on_load_checkpoint: four lines; with CUDA, its generators too)
    --device cuda       on the GPU (Lightning's accelerator), with its `deterministic=True` as on the CPU
    --pause S           seconds it idles after announcing each save (default 0.3: a real step's time, so that a
                        stop sent as the line is read lands before the next update, as it would in a long run)"""

import argparse
import os
import time

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from safetensors.torch import save_file

from reprocube import probe

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=4)
parser.add_argument("--save-steps", type=int, default=8)
parser.add_argument("--save-rng", action="store_true")
parser.add_argument("--pause", type=float, default=0.3)
parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
args = parser.parse_args()
torch.set_num_threads(1)

data = torch.Generator().manual_seed(1234)  # the dataset is fixed; the seed drives the training only
x = torch.randn(1024, 32, generator=data)
y = (x @ torch.randn(32, generator=data) > 0).long()


class Net(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Dropout(0.2),
                                       torch.nn.Linear(64, 2))  # fmt: skip

    def training_step(self, batch, index):
        inputs, targets = batch
        return torch.nn.functional.cross_entropy(self.net(inputs), targets)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)

    def on_save_checkpoint(self, checkpoint):
        if args.save_rng:
            checkpoint["torch_rng"] = torch.get_rng_state()
            if torch.cuda.is_available():  # on a GPU, dropout draws from the CUDA generator
                checkpoint["torch_cuda_rng"] = torch.cuda.get_rng_state_all()

    def on_load_checkpoint(self, checkpoint):
        if "torch_rng" in checkpoint:
            torch.set_rng_state(checkpoint["torch_rng"])
        if "torch_cuda_rng" in checkpoint:
            torch.cuda.set_rng_state_all(checkpoint["torch_cuda_rng"])


class Saved(ModelCheckpoint):
    def _save_checkpoint(self, trainer, filepath):
        super()._save_checkpoint(trainer, filepath)  # written: now say so (the line check stops at)
        print(f"step {trainer.global_step} saved", flush=True)
        time.sleep(args.pause)


L.seed_everything(int(os.environ.get("SEED", "0")), verbose=False)
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=64, shuffle=True)
model = Net()
saving = Saved(dirpath="checkpoints", every_n_train_steps=args.save_steps, save_top_k=0, save_last=True)
trainer = L.Trainer(max_epochs=args.epochs, accelerator=args.device, devices=1, logger=False, enable_progress_bar=False,
                    enable_model_summary=False, deterministic=True, callbacks=[probe.lightning_callback(), saving])  # fmt: skip
if os.path.exists("checkpoints/last.ckpt"):
    print("resuming from checkpoints/last.ckpt", flush=True)
trainer.fit(model, loader, ckpt_path="last")
save_file({name: tensor.contiguous() for name, tensor in model.state_dict().items()}, "model.safetensors")
