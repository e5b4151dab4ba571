"""``format: latent_wds``: WebDataset shards of cached latents and text embeddings (FastGen's
latent loaders), with ``neg_prompt_emb.npy`` beside them. With several buckets in
``geometry.buckets`` the output is one WebDataset folder per bucket plus ``buckets.json``
(:mod:`shardsmith.sinks.bucketed_wds`): every batch of one folder has one shape."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from shardsmith import formats
from shardsmith.outputs.base import OutputContext
from shardsmith.outputs.latent import LatentKind
from shardsmith.recipe import LatentWdsOutput


def bucketed(ctx: OutputContext) -> bool:
    """Whether the recipe's latent outputs are written one folder per bucket (several buckets)."""
    return len(ctx.recipe.geometry.buckets or []) > 1


def latent_shapes(ctx: OutputContext) -> dict[str, list[int]]:
    """The latent shape (no batch) of every bucket of the recipe, from the loaded VAE."""
    from shardsmith.transform.buckets import parse_buckets

    vae = ctx.stage().vae
    if vae is None:  # an audio-only dataset: no VAE, no latent shapes
        return {}
    spec, out = vae.spec, {}
    for b in parse_buckets(ctx.recipe.geometry.buckets):
        pixel = (3, b.height, b.width) if spec.kind == "image_vae" else (3, b.frames, b.height, b.width)
        out[str(b)] = list(spec.latent_shape(pixel))
    return out


class LatentWdsKind(LatentKind):
    format = "latent_wds"
    model = LatentWdsOutput
    preset = "image_latent"

    def sink(self, o, ctx: OutputContext, dest: Path, split: str):
        if bucketed(ctx):
            from shardsmith.sinks.bucketed_wds import BucketedWdsSink

            return BucketedWdsSink(o, dest)
        from shardsmith.sinks.wds import WdsSink

        return WdsSink(o, dest)

    def finalize(self, o, ctx: OutputContext, sink, split: str, dest: Path) -> dict[str, Any]:
        if bucketed(ctx):
            info = sink.finalize(ctx.ledger.unit_files(o.name, split), latent_shapes(ctx))
        else:
            info = super().finalize(o, ctx, sink, split, dest)
        stage = ctx.stage()
        if stage.text_encoder is not None:
            from shardsmith.sinks.latent_members import write_negative_prompt

            write_negative_prompt(dest / formats.NEG_PROMPT_FILE, stage, o.negative_prompt)
            info["neg_prompt_emb"] = formats.NEG_PROMPT_FILE
        return info
