"""A config command as the user typed it: its options (--config-file, --print-config, KEY=VALUE
overrides), its resolved config, the frameworks it covers, and the user's overrides and config files
that its child processes repeat."""

from __future__ import annotations

from dataclasses import dataclass, field

from omegaconf import DictConfig

from reprocube.config import config_files_overrides, load_config
from reprocube.errors import ConfigError
from reprocube.training.backend import FRAMEWORKS


@dataclass(frozen=True)
class ConfigOptions:
    all_frameworks_default: str | None = None  # `framework=all` allowed; the default framework
    aliases: dict[str, str] = field(default_factory=dict)  # a command's own short override names


def add_config_arguments(parser, all_frameworks_default: str | None = None, aliases: dict | None = None) -> None:
    """The options every config command takes; the CLI then hands the command args.invocation."""
    parser.add_argument(
        "--config-file",
        metavar="PATH",
        action="append",
        default=[],
        help=(
            "user yaml merged under the command-line overrides (e.g. workspace/train.yaml); repeatable, later files win"
        ),
    )
    parser.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="Hydra overrides")
    parser.set_defaults(config_options=ConfigOptions(all_frameworks_default, aliases or {}))


def invocation_of(args) -> Invocation:
    options: ConfigOptions = args.config_options
    overrides = [_expand_alias(o, options.aliases) for o in args.overrides]
    return load_invocation(overrides, args.config_file, options.all_frameworks_default)


def _expand_alias(override: str, aliases: dict[str, str]) -> str:
    key, sep, value = override.partition("=")
    return f"{aliases[key]}={value}" if sep and key in aliases else override


@dataclass(frozen=True)
class Invocation:
    cfg: DictConfig  # for verify and bench: the config of the first framework
    frameworks: list[str]
    overrides: list[str]  # the command line's, less `framework=` where it may be `all`
    config_files: list[str]


def load_invocation(
    overrides: list[str], config_files: list[str], all_frameworks_default: str | None = None
) -> Invocation:
    """With `all_frameworks_default` (verify, bench), `framework=` may be `all` or one framework, and
    defaults to that value; otherwise the config names one framework."""
    if all_frameworks_default is None:
        cfg = load_config(overrides, config_files)
        return Invocation(cfg, [cfg.framework.name], list(overrides), list(config_files))
    # `framework: all` may come from a config file too (the MLCube verify task's verify.yaml).
    frameworks, rest = frameworks_from(overrides, config_files_overrides(config_files), all_frameworks_default)
    cfg = load_config([*rest, f"framework={frameworks[0]}"], config_files)
    return Invocation(cfg, frameworks, rest, list(config_files))


def frameworks_from(
    overrides: list[str], file_overrides: list[str] = (), default: str = "pytorch"
) -> tuple[list[str], list[str]]:
    """`framework=all` (or one framework), from the command line or else the config files; the rest of
    the command-line overrides unchanged."""
    chosen = [
        o.split("=", 1)[1].strip("'\"") for o in [*file_overrides, *overrides] if o.startswith("framework=")
    ]  # config files' values come quoted
    rest = [o for o in overrides if not o.startswith("framework=")]
    name = chosen[-1] if chosen else default
    if name == "all":
        return list(FRAMEWORKS), rest
    if name not in FRAMEWORKS:
        raise ConfigError(f"framework must be all or one of {', '.join(FRAMEWORKS)}, got {name!r}")
    return [name], rest
