"""`reprocube reproduce`'s options, each defined once (OPTIONS), from which the command line is made
(reprocube.commands.reproduce); ReproduceOptions, the frozen whole a reproduction is handed."""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path

from reprocube.orchestration.options import Option

OPTIONS = (
    Option("match", bool, False, "if B differs, re-run with A's emulatable settings (ISA caps, threads)"),
    Option("study", Path, None, "a study.json giving the seed-to-seed spread"),
    Option("seeds", int, 0, "without a study: train N other seeds here to estimate the spread"),
    Option("public_key", Path, None, "refuse a receipt whose Ed25519 signature does not verify"),
    Option(
        "allow_config_change",
        bool,
        False,
        "accept overrides of result keys (reported as config differences) besides the place keys",
    ),
    Option(
        "allow_oversubscribe",
        bool,
        False,
        "train even where A's threads exceed this machine's usable CPUs (slower; JAX's result differs)",
    ),
    Option("ulp", int, 16, "the 'within N ULP' tier's N (default 16)"),
    Option(
        "stall_timeout",
        float,
        None,
        "end a training child that makes no progress for this long (default: warn every 120 s, never end it)",
        "SECONDS",
    ),
)
# What a script's receipt (written by reprocube check) also takes: the rest are for a run's receipt only.
SCRIPT_OPTIONS = ("match", "public_key")


@dataclass(frozen=True)
class ReproduceOptions:
    """One reproduction's options, whole (OPTIONS' values); made by `of`, with OPTIONS' defaults for those
    left out."""

    match: bool
    study: Path | None
    seeds: int
    public_key: Path | None
    allow_config_change: bool
    allow_oversubscribe: bool
    ulp: int
    stall_timeout: float | None

    @classmethod
    def of(cls, **values) -> ReproduceOptions:
        unknown = set(values) - {f.name for f in fields(cls)}
        if unknown:
            raise TypeError(f"not reproduce options: {sorted(unknown)}")
        return cls(**{**{o.name: o.default for o in OPTIONS}, **values})

    def given(self) -> list[Option]:
        """The options set to other than their default."""
        return [o for o in OPTIONS if getattr(self, o.name) != o.default]
