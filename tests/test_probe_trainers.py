"""The probe's callbacks for the trainers that own the loop (issue 56): `probe.transformers_callback()` (the
Hugging Face Trainer) and `probe.lightning_callback()` (Lightning), in process with tiny models. Each
records every optimizer update at the trainer's own step, announces every checkpoint after it is written,
says where a resumed trainer resumed, and does nothing outside check; the probe imports neither framework."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from reprocube import probe
from reprocube.analysis.probe_trace import read_trace


@pytest.mark.process
def test_the_probe_imports_no_trainer_and_the_factories_import_theirs_when_called(monkeypatch):
    code = (
        "import sys; from reprocube import probe; "
        "print(sorted({'transformers', 'lightning', 'pytorch_lightning', 'keras', 'accelerate', 'torch'} & set(sys.modules)))"
    )
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "[]\n"
    for name, factory in (("transformers", probe.transformers_callback), ("keras", probe.keras_callback)):
        monkeypatch.setitem(sys.modules, name, None)  # not installed
        with pytest.raises(ImportError):
            factory()
    monkeypatch.setitem(sys.modules, "lightning", None)
    monkeypatch.setitem(sys.modules, "lightning.pytorch", None)
    monkeypatch.setitem(sys.modules, "pytorch_lightning", None)
    with pytest.raises(ImportError):
        probe.lightning_callback()


def fresh(monkeypatch, path=None):
    """A new process's probe: recording to path, or inert (no REPROCUBE_PROBE)."""
    if path is None:
        monkeypatch.delenv(probe.ENV, raising=False)
    else:
        monkeypatch.setenv(probe.ENV, str(path))
    for variable in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setattr(probe, "_recorder", None)
    monkeypatch.setattr(probe, "_started", False)


def close_trace(path):
    probe._recorder.flush()
    probe._recorder.file.close()
    return read_trace(path)


# Hugging Face Trainer


def hf_train(where, resume=False, callbacks=()):
    transformers = pytest.importorskip("transformers")
    transformers.utils.logging.disable_progress_bar()
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=32,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=16,
        max_position_embeddings=8,
        num_labels=2,
    )
    model = transformers.BertForSequenceClassification(config)
    data = torch.Generator().manual_seed(1)
    tokens = torch.randint(4, 32, (32, 6), generator=data)
    rows = [{"input_ids": t, "labels": int(t[0] < 16)} for t in tokens]
    args = transformers.TrainingArguments(
        output_dir=str(where),
        max_steps=6,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,
        save_strategy="steps",
        save_steps=3,
        use_cpu=True,
        report_to="none",
        logging_strategy="no",
        disable_tqdm=True,
        seed=0,
    )
    trainer = transformers.Trainer(model=model, args=args, train_dataset=rows, callbacks=list(callbacks))
    trainer.train(resume_from_checkpoint=str(where / "checkpoint-3") if resume else None)
    return model


def streams(trace, *names) -> list:
    """Per update, the named streams (the learning rates as "lr"), one value or a tuple of them."""
    picked = [tuple(u.lr if n == "lr" else dict(u.streams).get(n) for n in names) for _, u in trace.updates]
    return [p[0] if len(names) == 1 else p for p in picked]


def test_the_transformers_callback_records_each_update_and_checkpoint_and_the_resume(tmp_path, monkeypatch):
    """6 updates of 2 micro-batches each (gradient accumulation), a checkpoint every 3: each update once at
    its global step, checkpoints 3 and 6 after their updates; a Trainer resumed from checkpoint-3 says
    resumed 3 and its updates 4-6 are the uninterrupted run's, bit for bit (the Trainer's resume is exact)."""
    fresh(monkeypatch, tmp_path / "clean.jsonl")
    hf_train(tmp_path / "run", callbacks=[probe.transformers_callback()])
    clean = close_trace(tmp_path / "clean.jsonl")
    assert [step for step, _ in clean.updates] == [1, 2, 3, 4, 5, 6]
    assert clean.checkpoints == [3, 6] and clean.resumed is None
    assert len(clean.names) == len(clean.updates[0][1].fingerprints) > 10  # the BERT's tensors
    fresh(monkeypatch, tmp_path / "resumed.jsonl")
    hf_train(tmp_path / "run", resume=True, callbacks=[probe.transformers_callback()])
    resumed = close_trace(tmp_path / "resumed.jsonl")
    assert resumed.resumed == 3 and [step for step, _ in resumed.updates] == [4, 5, 6]
    assert resumed.updates == clean.updates[3:]  # loss bits and fingerprints
    assert resumed.checkpoints == [6]
    # The streams (issue 67): each update's two micro-batches, the learning rate, torch's generator: the
    # resumed run's are the uninterrupted run's, and the batches differ from one update to the next.
    assert streams(resumed, "batch", "torch", "lr") == streams(clean, "batch", "torch", "lr")[3:]
    assert len(set(streams(clean, "batch"))) == 6 and all(u.lr for _, u in clean.updates)


def test_the_transformers_callback_is_inert_outside_check(tmp_path, monkeypatch):
    fresh(monkeypatch)
    callback = probe.transformers_callback()
    model = hf_train(tmp_path / "run", callbacks=[callback])
    assert callback.hooked is None and not model._forward_hooks and probe._recorder is None


# Lightning


def lightning_fit(where, callbacks, ckpt_path=None):
    L = pytest.importorskip("lightning")

    class Net(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 2)

        def training_step(self, batch, index):
            inputs, targets = batch
            return torch.nn.functional.cross_entropy(self.layer(inputs), targets)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    torch.manual_seed(0)
    data = torch.Generator().manual_seed(1)
    x = torch.randn(32, 4, generator=data)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, (x[:, 0] > 0).long()), batch_size=4)
    saving = L.pytorch.callbacks.ModelCheckpoint(dirpath=where, every_n_train_steps=2, save_top_k=-1)
    trainer = L.Trainer(
        max_epochs=2,
        accumulate_grad_batches=2,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[*callbacks, saving],
    )
    trainer.fit(Net(), loader, ckpt_path=ckpt_path)
    return sorted(p.name for p in where.iterdir())


def test_the_lightning_callback_records_each_update_and_checkpoint_and_the_resume(tmp_path, monkeypatch):
    """8 batches an epoch, 2 accumulated per update: 4 updates an epoch, a checkpoint every 2 updates
    (every_n_train_steps): each update once at trainer.global_step, each checkpoint after its update and
    after its file was written; fit(ckpt_path=...) from step 4 says resumed 4 and goes on at step 5."""
    fresh(monkeypatch, tmp_path / "clean.jsonl")
    files = lightning_fit(tmp_path / "ckpt", [probe.lightning_callback()])
    clean = close_trace(tmp_path / "clean.jsonl")
    assert [step for step, _ in clean.updates] == list(range(1, 9))
    assert clean.checkpoints == [2, 4, 6, 8] and len(files) == 4, files
    assert clean.names == ["layer.bias", "layer.weight"]
    fresh(monkeypatch, tmp_path / "resumed.jsonl")
    again = lightning_fit(tmp_path / "again", [probe.lightning_callback()], ckpt_path=str(tmp_path / "ckpt" / files[1]))
    resumed = close_trace(tmp_path / "resumed.jsonl")
    assert resumed.resumed == 4 and [step for step, _ in resumed.updates] == [5, 6, 7, 8]
    assert streams(resumed, "batch", "lr") == streams(clean, "batch", "lr")[4:]  # issue 67's streams
    assert len(set(streams(clean, "batch"))) == 4  # an epoch's 4 updates, each of its own 2 batches
    # Resumed at the end of epoch 0, Lightning writes a step-4 checkpoint again (now named epoch 1's) before
    # its first update: every write is announced, that one too.
    assert resumed.checkpoints == [4, 6, 8] and again == [
        "epoch=1-step=4.ckpt",
        "epoch=1-step=6.ckpt",
        "epoch=1-step=8.ckpt",
    ]


def test_the_lightning_callback_is_inert_outside_check(tmp_path, monkeypatch):
    fresh(monkeypatch)
    lightning_fit(tmp_path / "ckpt", [probe.lightning_callback()])
    assert probe._recorder is None
