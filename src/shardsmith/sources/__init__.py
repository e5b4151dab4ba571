"""Sources read what the user has and yield :class:`~shardsmith.records.Item` records.

``open_sources(recipe)`` resolves every declared source to a :class:`SourceInfo` and an
iterator factory; sources never decode media (that is the plan's and transform's job).
"""

from shardsmith.sources.base import MEDIA_EXTENSIONS, media_kind, open_sources

__all__ = ["MEDIA_EXTENSIONS", "media_kind", "open_sources"]
