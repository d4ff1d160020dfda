"""What a run or a script leaves beside its training, each format beside its writer and read strictly: the
step trace, OPS.json, the environment fingerprint and its comparison, the tensors and outputs researchers'
scripts save, script receipts. Below the engine that judges them (reprocube.analysis), which none imports."""
