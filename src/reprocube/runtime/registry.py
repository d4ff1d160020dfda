"""The one way a registry entry ("module:Class") becomes a class: imported only when asked for, since each
framework (and its loader) is an optional, heavy dependency; a missing package is one ConfigError."""

from __future__ import annotations

import importlib

from reprocube.errors import ConfigError


def import_registered(target: str, what: str) -> type:
    """The class `target` names; `what` (e.g. "framework=jax") starts the error line."""
    module_name, class_name = target.split(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"{what} needs a package that is not installed: {exc}") from None
    return getattr(module, class_name)
