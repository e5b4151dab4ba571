"""``format: latent_wds``: WebDataset shards of cached latents and text embeddings (FastGen's
latent loaders), with ``neg_prompt_emb.npy`` beside them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from shardsmith import formats
from shardsmith.outputs.base import OutputContext
from shardsmith.outputs.latent import LatentKind
from shardsmith.recipe import LatentWdsOutput


class LatentWdsKind(LatentKind):
    format = "latent_wds"
    model = LatentWdsOutput
    preset = "image_latent"

    def sink(self, o, ctx: OutputContext, dest: Path, split: str):
        from shardsmith.sinks.wds import WdsSink

        return WdsSink(o, dest)

    def finalize(self, o, ctx: OutputContext, sink, split: str, dest: Path) -> dict[str, Any]:
        info = super().finalize(o, ctx, sink, split, dest)
        stage = ctx.stage()
        if stage.text_encoder is not None:
            from shardsmith.sinks.latent_members import write_negative_prompt

            write_negative_prompt(dest / formats.NEG_PROMPT_FILE, stage, o.negative_prompt)
            info["neg_prompt_emb"] = formats.NEG_PROMPT_FILE
        return info
