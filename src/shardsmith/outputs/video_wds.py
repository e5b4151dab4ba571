"""``format: video_wds``: WebDataset shards of raw clips as FastGen's ``VideoLoaderConfig`` reads
them (key_map ``{real: mp4, condition: txt}``): ``<key>.mp4`` cut to the clip's bucket of
``geometry.buckets`` at ``geometry.fps`` (the source bytes when they already match, else
re-encoded), ``<key>.txt`` (the caption) and ``<key>.json`` (source, fps, frames, original size,
crop, passthrough), ``shard_count.json`` beside the shards; one folder whatever the buckets (the
loader resizes every clip to its ``video_size``). No encoder, no model. Samples:
:mod:`shardsmith.transform.video_samples`. Read by the ``video`` loader preset."""

from __future__ import annotations

from pathlib import Path

from shardsmith.outputs.base import OutputContext, OutputKind
from shardsmith.recipe import VideoWdsOutput


class VideoWdsKind(OutputKind):
    format = "video_wds"
    model = VideoWdsOutput
    preset = "video"

    def maker(self, o, ctx: OutputContext):
        from shardsmith.transform.video_samples import VideoSampleMaker

        r = ctx.recipe
        return VideoSampleMaker(o, r.geometry.buckets, r.images, r.geometry.fps, ctx.sources)

    def sink(self, o, ctx: OutputContext, dest: Path, split: str):
        from shardsmith.sinks.wds import WdsSink

        return WdsSink(o, dest)
