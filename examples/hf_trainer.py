"""The Hugging Face `Trainer` resuming the way its documentation says, for `reprocube check`: a tiny BERT
classifier built from a config (nothing downloaded) on synthetic token sequences, a checkpoint every
`--save-steps` updates (mid-epoch and at epochs' ends), and `trainer.train(resume_from_checkpoint=True)`
when a checkpoint is there. SIGTERM is left to Python's default, as the Trainer leaves it: the process
dies. Outputs: model.safetensors (the trained weights). The probe's callback (list it first) records every
update and announces every checkpoint; it does nothing outside check. What check finds here is in
docs/frameworks.md (measured, not assumed).

    --save-steps N   a checkpoint every N updates (an epoch is 16)
    --device cuda    on the GPU, with the Trainer's documented `full_determinism=True` (deterministic
                     algorithms, cuBLAS's workspace setting, cuDNN's deterministic kernels)
    --pause S        seconds it idles after announcing each save (default 0.3: a real step's time, so that a
                     stop sent as the line is read lands before the next update, as it would in a long run)"""

import argparse
import os
import time

import torch
import transformers
from safetensors.torch import save_file
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainerCallback, TrainingArguments
from transformers.trainer_utils import get_last_checkpoint

from reprocube import probe

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=4)
parser.add_argument("--save-steps", type=int, default=8)
parser.add_argument("--pause", type=float, default=0.3)
parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
args = parser.parse_args()
torch.set_num_threads(1)
torch.use_deterministic_algorithms(True)
transformers.utils.logging.disable_progress_bar()  # a bar per checkpoint written

data = torch.Generator().manual_seed(1234)  # the dataset is fixed; the seed drives the training only
tokens = torch.randint(4, 64, (512, 12), generator=data)
labels = ((tokens < 20).sum(1) > 3).long()


class Sequences(torch.utils.data.Dataset):
    def __len__(self):
        return len(tokens)

    def __getitem__(self, i):
        return {"input_ids": tokens[i], "labels": labels[i]}


class Saved(TrainerCallback):
    def on_save(self, training, state, control, **kwargs):  # the Trainer calls it after the checkpoint is written
        print(f"step {state.global_step} saved", flush=True)
        time.sleep(args.pause)


config = BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                    max_position_embeddings=16, num_labels=2)  # fmt: skip
training = TrainingArguments(output_dir="checkpoints", num_train_epochs=args.epochs, per_device_train_batch_size=32,
                             learning_rate=1e-3, save_strategy="steps", save_steps=args.save_steps,
                             seed=int(os.environ.get("SEED", "0")), use_cpu=args.device == "cpu", report_to="none",
                             full_determinism=args.device == "cuda",
                             logging_strategy="no", disable_tqdm=True, dataloader_num_workers=0)  # fmt: skip
torch.manual_seed(training.seed)  # the initial weights (the Trainer seeds again before training)
model = BertForSequenceClassification(config)
trainer = Trainer(
    model=model, args=training, train_dataset=Sequences(), callbacks=[probe.transformers_callback(), Saved()]
)
resume = get_last_checkpoint("checkpoints") is not None if os.path.isdir("checkpoints") else False
if resume:
    print(f"resuming from {get_last_checkpoint('checkpoints')}", flush=True)
trainer.train(resume_from_checkpoint=True if resume else None)
save_file({name: tensor.contiguous() for name, tensor in model.state_dict().items()}, "model.safetensors")
