"""What every encoder the encode stage holds provides, and the names they are held by.

Contract
- An :class:`Encoder` has a ``spec`` (its family, kind and shapes, ``to_dict()``) and a
  ``provenance`` (where its weights came from, ``to_dict()``; ``weights == "random-weights"`` for
  a model built from a config): the manifest, the cache stamp and the random-weights warning read
  only these two, by name.
- :data:`ENCODER_NAMES`: the names an output may ask for (``OutputKind.encoders``), in the order
  the manifest lists them: ``vae`` (:mod:`~shardsmith.encode.vae`), ``text``
  (:mod:`~shardsmith.encode.text`), ``audio_vae`` (:mod:`~shardsmith.encode.audio_vae`) and ``teacher``
  (:mod:`~shardsmith.encode.teacher`, run for several solver steps by ``shardsmith distill``).
- ``missing(stage, names)``: the names an output needs that the stage does not hold.
"""

from __future__ import annotations

from typing import Any, Protocol

ENCODER_NAMES = ("vae", "text", "audio_vae", "teacher")


class Encoder(Protocol):
    spec: Any
    provenance: Any


def held(vae: Encoder | None, text: Encoder | None, audio_vae: Encoder | None = None,
         teacher: Encoder | None = None) -> dict[str, Encoder]:
    """The stage's encoders by name (those that are loaded), in :data:`ENCODER_NAMES` order."""
    return {name: enc for name, enc in (("vae", vae), ("text", text), ("audio_vae", audio_vae), ("teacher", teacher))
            if enc is not None}


def missing(encoders: dict[str, Encoder], names: tuple[str, ...]) -> list[str]:
    return [n for n in names if n not in encoders]
