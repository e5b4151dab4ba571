"""The LTX-trainer ``.precomputed/`` tree (shared/reference/ltx-trainer.md §2.5).

One sub-folder per kind of cache; a sample's file has the same relative path in every
sub-folder, mirroring its media path (``clips/a.mp4`` -> ``<subdir>/clips/a.pt``)::

    latents/clips/a.pt          {"latents": [C, F', H', W'], "num_frames": F', "height": H', "width": W', "fps": float}
    conditions/clips/a.pt       {"video_prompt_embeds": [L, D], "prompt_attention_mask": [L] int64
                                 (+ "audio_prompt_embeds": [L, D_a])}
    audio_latents/, reference_audio_latents/   {"latents": [8, T, 16], "num_time_steps": T, ...}
    reference_latents/          as latents/, named after the target's path
    video_masks/                {"mask": [F', H', W']}
    audio_masks/                {"mask": [T]}

``shardsmith.json`` at the root records the encoders and buckets the caches were made with.
The trainer pairs files across the folders it is given by relative path: the primary folder is
``latents`` if given, else the first, and a primary file is a sample only when every other
folder holds the same relative path.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath

LATENTS = "latents"
CONDITIONS = "conditions"
AUDIO_LATENTS = "audio_latents"
REFERENCE_LATENTS = "reference_latents"
REFERENCE_AUDIO_LATENTS = "reference_audio_latents"
VIDEO_MASKS = "video_masks"
AUDIO_MASKS = "audio_masks"

#: every folder an LTX trainer reads, in the order verify lists them
TRAINER_DIRS = (LATENTS, CONDITIONS, AUDIO_LATENTS, REFERENCE_LATENTS, VIDEO_MASKS, AUDIO_MASKS,
                REFERENCE_AUDIO_LATENTS)
#: the folders shardsmith writes (a video/image cache, its audio cache and its text conditions)
WRITTEN_DIRS = (LATENTS, CONDITIONS, AUDIO_LATENTS)
#: the folders a trainer needs at least (``conditions/`` is always required)
DEFAULT_DIRS = (LATENTS, CONDITIONS)
#: any of these directly in a folder makes it a ``.precomputed/`` tree
MARKER_DIRS = (LATENTS, CONDITIONS, AUDIO_LATENTS)

PRECOMPUTED_STAMP = "shardsmith.json"  # the encoders and buckets its caches were made with
#: ``repair`` moves a tree's unreadable and unpaired files here, below the build's state folder
#: (``<build>/.shardsmith/quarantine/<tree, relative to the build>/<time>/<subdir>/<rel>``; for a
#: tree outside any build, ``<tree>/.shardsmith/quarantine/<time>/...``, where no trainer looks)
QUARANTINE_DIR = "quarantine"
#: the key of a cache dict whose shape must agree within a folder, per kind of folder
SHAPE_KEYS = {LATENTS: "latents", REFERENCE_LATENTS: "latents", AUDIO_LATENTS: "latents",
              REFERENCE_AUDIO_LATENTS: "latents", CONDITIONS: "video_prompt_embeds", VIDEO_MASKS: "mask",
              AUDIO_MASKS: "mask"}
CACHE_EXT = ".pt"


def mirrored(relpath: str, source_name: str | None) -> str:
    """``clips/a.mp4`` -> ``clips/a.pt`` (prefixed by the source name when several sources feed it);
    refuses a path that would leave the tree."""
    p = PurePosixPath(relpath).with_suffix(CACHE_EXT)
    if ".." in p.parts or p.is_absolute():
        raise ValueError(f"media path {relpath!r} cannot be mirrored inside .precomputed/")
    return str(PurePosixPath(source_name) / p) if source_name else str(p)


def cache_member(subdir: str, rel: str) -> str:
    """The path of sample ``rel``'s file in ``subdir``, relative to the tree's root."""
    return f"{subdir}/{rel}"


def primary_dir(dirs: list[str] | tuple[str, ...]) -> str:
    """The folder the trainer lists samples from: ``latents`` if given, else the first."""
    return LATENTS if LATENTS in dirs else dirs[0]


def present_dirs(root: Path) -> list[str]:
    """The trainer folders that exist in ``root``, in :data:`TRAINER_DIRS` order."""
    return [d for d in TRAINER_DIRS if (root / d).is_dir()]


def cache_files(root: Path, subdir: str) -> list[str]:
    """Relative paths (``/``-separated, sorted) of every ``.pt`` in ``root/subdir``."""
    base = root / subdir
    return sorted(p.relative_to(base).as_posix() for p in base.rglob(f"*{CACHE_EXT}"))
