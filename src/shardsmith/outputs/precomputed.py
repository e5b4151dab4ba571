"""``format: precomputed``: the LTX trainer's ``.precomputed/`` tree (``latents/``, ``conditions/``)."""

from __future__ import annotations

from pathlib import Path

from shardsmith.outputs.base import OutputContext
from shardsmith.outputs.latent import LatentKind
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
        sink.check_stamp(ctx.stage().stamp(ctx.recipe))  # refused before anything is written
        return sink
