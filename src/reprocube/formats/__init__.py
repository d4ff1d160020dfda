"""What a run leaves and travels with it, and how each is read: the receipt, traces, OPS.json, the
environment fingerprint, the outputs and tensors of scripts, script receipts and signatures. Below the
engine that judges them (reprocube.analysis): none imports it."""
