"""The LTX-2 trainer's config for a ``.precomputed/`` tree: what ``register`` prints to paste.

Names follow the trainer's config models (Lightricks/LTX-2, ``packages/ltx-trainer``):
``LtxTrainerConfig.data`` is ``DataConfig`` (``preprocessed_data_root``: the folder holding the
cache sub-folders, checked to exist and resolved by the trainer, so written absolute;
``num_dataloader_workers``, default 2). The sources (sub-folder -> batch key) come from the
``flexible`` training strategy (``FlexibleStrategyConfig.get_data_sources``): ``conditions`` always,
``video.latents_dir`` -> ``video_latents``, ``audio.latents_dir`` -> ``audio_latents``, a
``reference`` condition's ``latents_dir``. ``optimization.batch_size`` must be 1 when a latent
folder holds several shapes (the trainer's DataLoader stacks each batch).
"""

from __future__ import annotations

import json
from pathlib import Path

from shardsmith.formats import precomputed as layout


def ltx_data_section(root: Path, dirs: list[str], several_shapes: bool, workers: int = 2) -> str:
    """The YAML to paste into an LTX-2 trainer config for the tree at ``root`` holding ``dirs``."""
    root = Path(root).resolve()
    video, audio = layout.LATENTS in dirs, layout.AUDIO_LATENTS in dirs
    if not (video or audio):
        raise ValueError(f"{root} has neither {layout.LATENTS}/ nor {layout.AUDIO_LATENTS}/: the LTX trainer "
                         "needs a generated modality")
    if layout.CONDITIONS not in dirs:
        raise ValueError(f"{root} has no {layout.CONDITIONS}/: the LTX trainer always reads the text conditions")
    q = json.dumps  # a double-quoted YAML scalar
    lines = ["# LTX-2 trainer config (packages/ltx-trainer): the data section and the strategy's folders",
             "data:",
             f"  preprocessed_data_root: {q(str(root))}",
             f"  num_dataloader_workers: {workers}",
             "training_strategy:",
             '  name: "flexible"']
    sources = [f"{layout.CONDITIONS} -> conditions"]
    if video:
        lines += ["  video:", "    is_generated: true", f"    latents_dir: {q(layout.LATENTS)}"]
        sources.append(f"{layout.LATENTS} -> video_latents")
        if layout.REFERENCE_LATENTS in dirs:
            lines += ["    conditions:", '      - type: "reference"',
                      f"        latents_dir: {q(layout.REFERENCE_LATENTS)}"]
            sources.append(f"{layout.REFERENCE_LATENTS} -> {layout.REFERENCE_LATENTS}")
    if audio:
        lines += ["  audio:", "    is_generated: true", f"    latents_dir: {q(layout.AUDIO_LATENTS)}"]
        sources.append(f"{layout.AUDIO_LATENTS} -> audio_latents")
    if several_shapes:
        lines += ["optimization:", "  batch_size: 1  # several latent shapes in this tree: the LTX trainer needs "
                  "batch_size: 1 for this tree"]
    lines.append("# sources (folder -> batch key): " + ", ".join(sources))
    return "\n".join(lines)
