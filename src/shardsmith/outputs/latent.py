"""What the latent outputs share: the pixel maker in the recipe's buckets and the member renderer."""

from __future__ import annotations

from shardsmith.outputs.base import OutputContext, OutputKind


class LatentKind(OutputKind):
    encoders = ("vae", "text")  # text only when models.text is set

    def maker(self, o, ctx: OutputContext):
        from shardsmith.transform.buckets import parse_buckets
        from shardsmith.transform.latent_pixels import LatentPixelMaker

        r = ctx.recipe
        return LatentPixelMaker(parse_buckets(r.geometry.buckets), r.images, r.geometry.fps)

    def renderer(self, o, ctx: OutputContext):
        from shardsmith.sinks.latent_members import LatentMembers

        return LatentMembers(o, ctx.sources, multi_source=len(ctx.recipe.source_ids(o)) > 1)
