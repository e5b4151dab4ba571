"""``format: latent_zip``: the EDM2 / FastGen latent ZIP (``imagenet_256_sd.zip``), read by
FastGen's ``ImageFolderDataset`` (preset ``class_zip``).

Uncompressed; one member ``{idx[:5]}/img-mean-std-{idx:08d}.npy`` per image, float32
``[2C, S/f, S/f]``: the raw posterior mean of ``models.vae`` then its std (``store: mean_std``,
required by the recipe), for the image cut to ``S x S`` by the image ZIP's EDM transform
(``center-crop-dhariwal`` by default, as EDM2 does for ImageNet); ``dataset.json`` labels exactly
as the image ZIP (class-conditional when a source is labelled, ``null`` otherwise). Units of
``unit`` images are staged, written in any order and assembled, numbered globally, at the end.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from shardsmith import formats
from shardsmith.outputs.base import OutputContext
from shardsmith.outputs.zip import ZipKind
from shardsmith.recipe import LatentZipOutput


class LatentZipKind(ZipKind):
    format = "latent_zip"
    model = LatentZipOutput
    encoders = ("vae",)
    preset = "class_zip"

    def maker(self, o, ctx: OutputContext):
        from shardsmith.transform.samples import LatentZipPixelMaker

        return LatentZipPixelMaker(o, ctx.recipe.images, ctx.sources, self._labelled(o, ctx))

    def sink(self, o, ctx: OutputContext, dest: Path, split: str):
        from shardsmith.sinks.zip import LatentZipSink

        staging = ctx.root / formats.ZIP_STAGE_DIR / o.name / split
        return LatentZipSink(o, dest, staging, labelled=self._labelled(o, ctx))

    def renderer(self, o, ctx: OutputContext):
        from shardsmith.sinks.latent_zip_members import LatentZipMembers

        return LatentZipMembers(o)

    def finalize(self, o, ctx: OutputContext, sink, split: str, dest: Path) -> dict[str, Any]:
        info = super().finalize(o, ctx, sink, split, dest)
        spec = ctx.stage().vae.spec
        info["latent_shape"] = list(spec.latent_shape((3, o.side, o.side)))
        info["latent"] = "posterior mean then std (raw, unnormalised), float32 .npy"
        return info
