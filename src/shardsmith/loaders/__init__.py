"""Loaders that read what shardsmith (or anyone) wrote: WebDataset shards and EDM ZIPs.

Importable without the CLI: ``from shardsmith.loaders import from_config, preset_config``.
The names below are imported on first use (PEP 562), so a submodule that needs no torch
(``loaders.slots``, ``loaders.wds_config``, ``loaders.shard_reader``) can be imported without it.
"""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    "LOADER_PRESETS": ("presets", "PRESETS"), "build_loader": ("presets", "build_loader"),
    "from_config": ("presets", "from_config"), "preset_config": ("presets", "preset_config"),
    "empty_slots": ("slots", "empty_slots"), "plan_slots": ("slots", "plan_slots"),
    "WdsLoader": ("wds", "WdsLoader"), "PRESETS": ("wds_config", "PRESETS"),
    "WdsLoaderConfig": ("wds_config", "WdsLoaderConfig"), "ZipImageDataset": ("zip", "ZipImageDataset"),
    "ZipLoaderConfig": ("zip", "ZipLoaderConfig"), "zip_loader": ("zip", "zip_loader"),
}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{where[0]}"), where[1])
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_WHERE))
