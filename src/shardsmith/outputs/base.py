"""What every output format provides to a build (:class:`OutputKind`), and what a build gives it
(:class:`OutputContext`).

Contract
- ``dest(root, o, split)``: the output's file or folder for ``split`` (the holdout under ``holdout/``).
- ``encoders_for(o, recipe)``: the encoders the output needs under ``recipe`` (``encoders``, less
  ``text`` where ``models.text`` is unset); an output that needs none is written without models.
- ``splits(o, recipe)``: the splits the output writes (None: all; ``kd_wds`` writes the train split
  alone); ``per_unit(o)``: items per unit of work; ``byte_bounded(o)``: units close on a byte budget that
  only the written samples' sizes decide (such an output's units are cut as they are written, in
  order; every other output's units are planned ahead, see :mod:`shardsmith.units.plan`).
- ``maker(o, ctx)``: the picklable per-item sample maker (runs in worker processes).
- ``sink(o, ctx, dest, split)``: the writer of one split; ``renderer(o, ctx)``: for outputs that
  need encoders, what turns an encoded batch into members (None otherwise).
- ``finalize(o, ctx, sink, split, dest)``: the index files; returns the manifest block of the split.
- ``warnings(o, ctx, files)``: manifest warnings about the finished output.
- ``plans_ahead``: whether the output may start on a plan still running (a latent output first in
  the recipe does, see ``build._ahead_output``); False where a decision needs the whole plan.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from shardsmith.plan.ledger import Ledger
from shardsmith.records import SourceInfo
from shardsmith.split.assign import TRAIN


@dataclass
class OutputContext:
    """What an output needs from the build that writes it."""

    recipe: Any  # the Recipe
    root: Path  # the folder being written
    ledger: Ledger
    sources: list[SourceInfo]
    stage: Callable[[], Any]  # the encode stage (loaded on first call); None without encoders


class OutputKind(ABC):
    """One output format (subclass per format, registered in :mod:`shardsmith.outputs.registry`)."""

    format: ClassVar[str]
    model: ClassVar[type]  # its recipe model (``recipe.py``)
    encoders: ClassVar[tuple[str, ...]] = ()  # "vae", "text" ...: the encode stage it needs
    roles: ClassVar[tuple[str, ...]] = ("target",)
    preset: ClassVar[str | None] = None  # the loader / verify preset that reads it
    plans_ahead: ClassVar[bool] = True  # may start before the plan is complete

    def dest(self, root: Path, o, split: str) -> Path:
        rel = self.target(o)
        return root / rel if split == TRAIN else root / "holdout" / rel

    @staticmethod
    def target(o) -> str:
        """The output's path relative to the build folder (its ``dir`` or ``path``)."""
        return o.dir

    def encoders_for(self, o, recipe) -> tuple[str, ...]:
        """The encoders ``o`` needs under ``recipe``: :attr:`encoders`, ``text`` only when
        ``models.text`` is set, ``vae`` only when ``models.vae`` is (an audio-only dataset has none),
        ``audio_vae`` only when ``o`` writes audio (:meth:`Recipe.audio_outputs`)."""
        present = {"text": recipe.models.text is not None, "vae": recipe.models.vae is not None,
                   "audio_vae": any(a is o for a in recipe.audio_outputs())}
        return tuple(e for e in self.encoders if present.get(e, True))

    def splits(self, o, recipe) -> tuple[str, ...] | None:
        """The splits ``o`` writes; None: every split of the recipe. An item of another split gets
        ``skipped:holdout`` in ``o``."""
        return None

    def per_unit(self, o) -> int:
        return o.samples_per_shard

    def byte_bounded(self, o) -> bool:
        return getattr(o, "max_shard_bytes", None) is not None

    @abstractmethod
    def maker(self, o, ctx: OutputContext):
        """The picklable per-item sample maker of output ``o``."""

    @abstractmethod
    def sink(self, o, ctx: OutputContext, dest: Path, split: str):
        """The writer of ``o``'s ``split`` at ``dest``."""

    def renderer(self, o, ctx: OutputContext):
        return None

    def finalize(self, o, ctx: OutputContext, sink, split: str, dest: Path) -> dict[str, Any]:
        return sink.finalize(ctx.ledger.units(o.name, split))

    def warnings(self, o, ctx: OutputContext, files: dict[str, Any]) -> list[str]:
        return []
