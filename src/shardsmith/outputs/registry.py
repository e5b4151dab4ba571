"""The output formats by name. To add one: a module in this package with an
:class:`~shardsmith.outputs.base.OutputKind` subclass, its recipe model in ``recipe.py``, and one
line here."""

from __future__ import annotations

from shardsmith.outputs.base import OutputKind
from shardsmith.outputs.kd_wds import KdWdsKind
from shardsmith.outputs.latent_wds import LatentWdsKind
from shardsmith.outputs.latent_zip import LatentZipKind
from shardsmith.outputs.precomputed import PrecomputedKind
from shardsmith.outputs.prompt_wds import PromptWdsKind
from shardsmith.outputs.video_wds import VideoWdsKind
from shardsmith.outputs.wds import WdsKind
from shardsmith.outputs.zip import ZipKind

REGISTRY: dict[str, OutputKind] = {k.format: k for k in (WdsKind(), ZipKind(), LatentWdsKind(), PrecomputedKind(), LatentZipKind(), VideoWdsKind(), PromptWdsKind(), KdWdsKind())}


def kind_of(o) -> OutputKind:
    """The format module of recipe output ``o`` (by its ``format`` name)."""
    return REGISTRY[o.format]


def needs_encoders(recipe) -> bool:
    """Whether any output of ``recipe`` needs the encode stage."""
    return any(kind_of(o).encoders_for(o, recipe) for o in recipe.outputs)
