"""Loaders that read what shardsmith (or anyone) wrote: WebDataset shards (``wds``)."""

from shardsmith.loaders.wds import PRESETS, WdsLoader, WdsLoaderConfig, empty_slots, plan_slots

__all__ = ["PRESETS", "WdsLoader", "WdsLoaderConfig", "empty_slots", "plan_slots"]
