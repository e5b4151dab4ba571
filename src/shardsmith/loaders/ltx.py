"""The LTX-2 trainer's config for a ``.precomputed/`` tree: what ``register`` prints to paste.

Names follow the trainer's config models (Lightricks/LTX-2, ``packages/ltx-trainer``):
``LtxTrainerConfig.data`` is ``DataConfig`` (``preprocessed_data_root``: the folder holding the
cache sub-folders, checked to exist and resolved by the trainer, so written absolute;
``num_dataloader_workers``, default 2). The sources (sub-folder -> batch key) come from the
``flexible`` training strategy (``FlexibleStrategyConfig.get_data_sources``): ``conditions`` always,
``video.latents_dir`` -> ``video_latents``, ``audio.latents_dir`` -> ``audio_latents``, a
``reference`` condition's ``latents_dir``. ``optimization.batch_size`` must be 1 when a latent
folder holds several shapes (the trainer's DataLoader stacks each batch).

:func:`ltx_data_section` infers the strategy from the folders present; :func:`ltx_mode_section` writes
that of a tree's LTX training mode (its stamp's ``"mode"``, ``formats.precomputed.MODES``): the mode's
folders only, each modality generated or frozen, and its conditions (``first_frame``, ``reference``,
``mask``: ``MaskConditionConfig.mask_dir``, read as a data source of its own).
"""

from __future__ import annotations

import json
from pathlib import Path

from shardsmith.formats import precomputed as layout


def _head(about: str, root, workers: int) -> list[str]:
    """The first lines of a printed LTX-2 trainer config: its comment (``about`` after the trainer's
    name), the data section and the flexible strategy's name."""
    return [f"# LTX-2 trainer config (packages/ltx-trainer){about}: the data section and the strategy's folders",
            "data:",
            f"  preprocessed_data_root: {json.dumps(str(root))}",
            f"  num_dataloader_workers: {workers}",
            "training_strategy:",
            '  name: "flexible"']

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
    lines = _head("", root, workers)
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


# --- a tree stamped with its LTX training mode (formats.precomputed.MODES, ltx-trainer.md §5) -------------

_GEN, _FROZEN = True, False
_REF_VIDEO = {"type": "reference", "latents_dir": layout.REFERENCE_LATENTS}
_REF_AUDIO = {"type": "reference", "latents_dir": layout.REFERENCE_AUDIO_LATENTS}
_NEEDS_VALUE = "  # set yours: shardsmith does not know it"
#: mode -> {modality: (is_generated, [conditions])}: the flexible strategy's modalities in each mode
#: (a condition's values as the reference's table gives them; ``None`` values are the user's to set)
MODE_STRATEGY: dict[str, dict[str, tuple[bool, list[dict]]]] = {
    "t2v": {"video": (_GEN, []), "audio": (_GEN, [])},
    "i2v": {"video": (_GEN, [{"type": "first_frame", "probability": 0.5}]), "audio": (_GEN, [])},
    "video-extend": {"video": (_GEN, [{"type": "prefix", "temporal_boundary": None}]), "audio": (_GEN, [])},
    "v2v-ic": {"video": (_GEN, [_REF_VIDEO, {"type": "first_frame", "probability": 0.2}])},
    "a2v": {"video": (_GEN, []), "audio": (_FROZEN, [])},
    "v2a": {"video": (_FROZEN, []), "audio": (_GEN, [])},
    "video-inpaint": {"video": (_GEN, [{"type": "mask", "mask_dir": layout.VIDEO_MASKS}])},
    "video-outpaint": {"video": (_GEN, [{"type": "spatial_crop", "spatial_region": None}])},
    "t2a": {"audio": (_GEN, [])},
    "audio-extend": {"audio": (_GEN, [{"type": "prefix", "temporal_boundary": None}])},
    "audio-inpaint": {"audio": (_GEN, [{"type": "mask", "mask_dir": layout.AUDIO_MASKS}])},
    "a2a-ic": {"audio": (_GEN, [_REF_AUDIO])},
    "av2av-ic": {"video": (_GEN, [_REF_VIDEO]), "audio": (_GEN, [_REF_AUDIO])},
    "image": {"video": (_GEN, [])},
    "video": {"video": (_GEN, [])},
}
_LATENTS_DIR = {"video": layout.LATENTS, "audio": layout.AUDIO_LATENTS}
_BATCH_KEY = {"video": "video_latents", "audio": "audio_latents"}


def ltx_mode_section(root: Path, present: list[str], mode: str, mode_from: str, several_shapes: bool,
                     workers: int = 2) -> str:
    """The YAML to paste for the tree at ``root`` (holding the trainer folders ``present``) made for
    LTX training ``mode`` (``mode_from``: where that was read, e.g. ``shardsmith.json``): the folders
    ``formats.precomputed.MODES`` gives the mode, each modality generated or frozen and its conditions
    (first frame, reference, mask) as the flexible strategy reads them. A folder the mode reads that
    the tree lacks is refused (the trainer would refuse to start)."""
    root = Path(root).resolve()
    need = layout.mode_dirs(mode)  # refuses an unknown mode
    missing = [d for d in need if d not in present]
    if missing:
        raise ValueError(f"{root}: mode {mode} ({mode_from}) reads {', '.join(d + '/' for d in need)}, but "
                         f"{', '.join(d + '/' for d in missing)} is missing: the LTX trainer refuses to start "
                         "without a folder its mode lists (rebuild, or fix the stamp's mode)")
    q = json.dumps
    lines = _head(f" for mode {mode} ({mode_from})", root, workers)
    sources = [f"{layout.CONDITIONS} -> conditions"]
    for modality, (generated, conditions) in MODE_STRATEGY[mode].items():
        lines += [f"  {modality}:", f"    is_generated: {'true' if generated else 'false'}",
                  f"    latents_dir: {q(_LATENTS_DIR[modality])}"]
        sources.append(f"{_LATENTS_DIR[modality]} -> {_BATCH_KEY[modality]}")
        if conditions:
            lines.append("    conditions:")
        for cond in conditions:
            first = True
            for k, v in cond.items():
                lead = "      - " if first else "        "
                first = False
                if v is None:
                    lines.append(f"{lead}{k}: null{_NEEDS_VALUE}")
                else:
                    lines.append(f"{lead}{k}: {q(v)}")
                if k in ("latents_dir", "mask_dir"):
                    sources.append(f"{v} -> {v}")
    if several_shapes:
        lines += ["optimization:", "  batch_size: 1  # several latent shapes in this tree: the LTX trainer needs "
                  "batch_size: 1 for this tree"]
    lines.append("# sources (folder -> batch key): " + ", ".join(sources))
    unread = [d for d in present if d not in need] + ([layout.CAMERAS] if (root / layout.CAMERAS).is_dir() else [])
    if unread:
        lines.append(f"# not read in mode {mode}: {', '.join(d + '/' for d in unread)}")
    return "\n".join(lines)
