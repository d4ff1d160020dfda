"""Framework trainers: one module each, holding only framework-specific code (see reprocube.training.backend)."""
