"""``format: zip``: the class-conditional EDM ``dataset_tool`` ZIP (FastGen's ``ImageFolderDataset``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from shardsmith import formats
from shardsmith.outputs.base import OutputContext, OutputKind
from shardsmith.recipe import ZipOutput


class ZipKind(OutputKind):
    format = "zip"
    model = ZipOutput
    preset = "class_zip"
    plans_ahead = False  # class-conditional or not is decided by the whole plan's labels

    @staticmethod
    def target(o) -> str:
        return o.path

    def per_unit(self, o) -> int:
        return o.unit

    def byte_bounded(self, o) -> bool:
        return False

    @staticmethod
    def _labelled(o, ctx: OutputContext) -> bool:
        return ctx.ledger.any_labelled(ctx.recipe.source_ids(o))

    def maker(self, o, ctx: OutputContext):
        from shardsmith.transform.samples import ZipSampleMaker

        return ZipSampleMaker(o, ctx.recipe.images, ctx.sources, self._labelled(o, ctx))

    def sink(self, o, ctx: OutputContext, dest: Path, split: str):
        from shardsmith.sinks.zip import ZipSink

        staging = ctx.root / formats.ZIP_STAGE_DIR / o.name / split
        return ZipSink(o, dest, staging, labelled=self._labelled(o, ctx))

    def finalize(self, o, ctx: OutputContext, sink, split: str, dest: Path) -> dict[str, Any]:
        labels = [lab for _, _, lab in ctx.ledger.written(o.name, split)]
        return sink.finalize(ctx.ledger.units(o.name, split), labels)

    def warnings(self, o, ctx: OutputContext, files: dict[str, Any]) -> list[str]:
        out = []
        for split, blk in files.items():
            if blk.get("labelled"):
                present = {lab for _, _, lab in ctx.ledger.written(o.name, split)}
                if present and present != set(range(max(present) + 1)):
                    out.append(f"{o.name}/{split}: class ids {sorted(set(range(max(present) + 1)) - present)} "
                               "have no image; EDM loaders size one-hot labels as max(label)+1")
        return out
