"""Loaders that read what shardsmith (or anyone) wrote: WebDataset shards and EDM ZIPs.

Importable without the CLI: ``from shardsmith.loaders import from_config, preset_config``.
"""

from shardsmith.loaders.presets import PRESETS as LOADER_PRESETS
from shardsmith.loaders.presets import build_loader, from_config, preset_config
from shardsmith.loaders.slots import empty_slots, plan_slots
from shardsmith.loaders.wds import WdsLoader
from shardsmith.loaders.wds_config import PRESETS, WdsLoaderConfig
from shardsmith.loaders.zip import ZipImageDataset, ZipLoaderConfig, zip_loader

__all__ = ["LOADER_PRESETS", "PRESETS", "WdsLoader", "WdsLoaderConfig", "ZipImageDataset", "ZipLoaderConfig",
           "build_loader", "empty_slots", "from_config", "plan_slots", "preset_config", "zip_loader"]
