"""One schema per result file reprocube writes for people and for later commands (verify.json,
compare.json, reproduce.json, study.json): its name, version and keys, the writer and the strict reader
side by side. The checkpoint manifest's schema is reprocube.training.checkpoint's, the receipt's reprocube.training.receipt's."""
