"""``format: precomputed``: the LTX trainer's ``.precomputed/`` tree (``latents/``, ``conditions/``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from shardsmith.outputs.base import OutputContext
from shardsmith.outputs.latent import LatentKind
from shardsmith.outputs.latent_wds import latent_shapes
from shardsmith.recipe import PrecomputedOutput


class PrecomputedKind(LatentKind):
    format = "precomputed"
    model = PrecomputedOutput
    preset = None  # verify reads the tree itself (verify/precomputed_check.py); no WDS loader preset

    def per_unit(self, o) -> int:
        return o.unit

    def byte_bounded(self, o) -> bool:
        return False

    def sink(self, o, ctx: OutputContext, dest: Path, split: str):
        from shardsmith.sinks.precomputed import PrecomputedSink

        sink = PrecomputedSink(o, dest)
        stamp = lambda: ctx.stage().stamp(ctx.recipe)  # noqa: E731 - (waits for the models)
        if sink.has_stamp():  # a tree already there: one of other encoders is refused before any work
            sink.check_stamp(stamp())
        else:  # a new tree: its items decode while the models load; stamped before its first files
            sink.stamp_before_first_write(stamp)
        return sink

    def finalize(self, o, ctx: OutputContext, sink, split: str, dest: Path) -> dict[str, Any]:
        from shardsmith.sinks.bucketed_wds import bucket_summary

        sink.settle_stamp()  # (a tree that got no unit is stamped too)
        # an item that failed on a resume: no file under its name, whatever its earlier attempt wrote
        rel = self.renderer(o, ctx).sample_rel
        sink.drop_items(rel(it) for it in ctx.ledger.unwritten_items(o.name, split, ctx.recipe.source_ids(o)))
        info = super().finalize(o, ctx, sink, split, dest)
        info["buckets"] = bucket_summary(ctx.ledger.unit_files(o.name, split), latent_shapes(ctx))
        return info

    def warnings(self, o, ctx: OutputContext, files: dict[str, Any]) -> list[str]:
        out = super().warnings(o, ctx, files)
        m = ctx.recipe.models
        if m.vae is not None and m.vae.family == "ltx2" and m.text is not None and m.text.family != "ltx2":
            out.append(f"{o.name}: the tree is made with LTX-2's VAE but its conditions come from a {m.text.family} "
                       "text encoder, without audio_prompt_embeds: the LTX-2 trainer builds its audio connector in "
                       "every mode and stops ('Audio connector is configured but no audio features were provided.'); "
                       "set models.text.family: ltx2 to write the conditions it reads")
        for split, blk in files.items():
            shapes = {tuple(b["latent_shape"]) for b in blk.get("buckets", {}).values() if b.get("latent_shape")}
            if len(shapes) > 1:
                out.append(f"{o.name}/{split}: the .precomputed/ tree holds {len(shapes)} latent shapes "
                           f"({', '.join(sorted(blk['buckets']))}); the LTX trainer needs batch_size: 1 for this "
                           "tree (its DataLoader stacks a batch), or build one tree per bucket")
        return out
