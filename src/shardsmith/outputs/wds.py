"""``format: wds``: WebDataset shards of images, captions and metadata (FastGen's ``ImageLoader``)."""

from __future__ import annotations

from pathlib import Path

from shardsmith.outputs.base import OutputContext, OutputKind
from shardsmith.recipe import WdsOutput


class WdsKind(OutputKind):
    format = "wds"
    model = WdsOutput
    preset = "image"

    def maker(self, o, ctx: OutputContext):
        from shardsmith.transform.samples import WdsSampleMaker

        return WdsSampleMaker(o, ctx.recipe.images, ctx.sources)

    def sink(self, o, ctx: OutputContext, dest: Path, split: str):
        from shardsmith.sinks.wds import WdsSink

        return WdsSink(o, dest)
