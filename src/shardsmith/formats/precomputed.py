"""The LTX-trainer ``.precomputed/`` tree (shared/reference/ltx-trainer.md §2.5).

One sub-folder per kind of cache; a sample's file has the same relative path in every
sub-folder, mirroring its media path (``clips/a.mp4`` -> ``<subdir>/clips/a.pt``; a second item the same
path would mirror to gets ``clips/a_<8 hex>.pt``: :func:`sample_rel`). A media path that leaves the source's
folder (a table row ``../shared/y.jpg`` or ``/data/y.jpg`` with ``allow_outside_paths: true``) is mirrored
inside the tree too, never beside it: each ``..`` becomes a ``__`` folder and the root of an absolute path a
``_`` folder (``latents/__/shared/y.pt``, ``latents/_/data/y.pt``: :func:`tree_path`)::

    latents/clips/a.pt          {"latents": [C, F', H', W'], "num_frames": F', "height": H', "width": W', "fps": float}
    conditions/clips/a.pt       {"video_prompt_embeds": [L, D], "prompt_attention_mask": [L] int64
                                 (+ "audio_prompt_embeds": [L, D_a])}
    audio_latents/, reference_audio_latents/   {"latents": [8, T, 16] float32, "num_time_steps": T,
                                                "frequency_bins": 16, "duration": seconds}
    reference_latents/          as latents/, named after the target's path
    video_masks/                {"mask": [F', H', W']}
    audio_masks/                {"mask": [T]}

``shardsmith.json`` at the root records the encoders and buckets the caches were made with.
The trainer pairs files across the folders it is given by relative path: the primary folder is
``latents`` if given, else the first, and a primary file is a sample only when every other
folder holds the same relative path.

Each LTX training mode reads ``conditions/`` and the folders of :data:`MODES`; the keys each folder's
dict holds are :data:`FOLDER_KEYS` (:func:`required_keys` adds ``audio_prompt_embeds`` to the
conditions of the modes with audio, :data:`AUDIO_MODES`).
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath

from shardsmith.formats.wds import key_base, unique_key

LATENTS = "latents"
CONDITIONS = "conditions"
AUDIO_LATENTS = "audio_latents"
REFERENCE_LATENTS = "reference_latents"
REFERENCE_AUDIO_LATENTS = "reference_audio_latents"
VIDEO_MASKS = "video_masks"
AUDIO_MASKS = "audio_masks"
CAMERAS = "cameras"  # camera-controlled video: {"camera": [F, 20]} per sample (extrinsics row-major, fx fy cx cy)

#: every folder an LTX trainer reads, in the order verify lists them
TRAINER_DIRS = (LATENTS, CONDITIONS, AUDIO_LATENTS, REFERENCE_LATENTS, VIDEO_MASKS, AUDIO_MASKS,
                REFERENCE_AUDIO_LATENTS)
#: the folders shardsmith writes (a video/image cache, its audio cache, its text conditions, its references)
WRITTEN_DIRS = (LATENTS, CONDITIONS, AUDIO_LATENTS, REFERENCE_LATENTS, REFERENCE_AUDIO_LATENTS, VIDEO_MASKS,
                AUDIO_MASKS, CAMERAS)
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

# --- the LTX training modes (shared/reference/ltx-trainer.md §5): what each one reads -----------------

#: mode -> the folders it needs besides ``conditions/`` (always required). ``image`` / ``video``:
#: a video-only tree (no audio), as shardsmith writes without ``models.audio_vae``
MODES: dict[str, tuple[str, ...]] = {
    "t2v": (LATENTS, AUDIO_LATENTS),
    "i2v": (LATENTS, AUDIO_LATENTS),
    "video-extend": (LATENTS, AUDIO_LATENTS),
    "v2v-ic": (LATENTS, REFERENCE_LATENTS),
    "a2v": (LATENTS, AUDIO_LATENTS),
    "v2a": (LATENTS, AUDIO_LATENTS),
    "video-inpaint": (LATENTS, VIDEO_MASKS),
    "video-outpaint": (LATENTS,),
    "t2a": (AUDIO_LATENTS,),
    "audio-extend": (AUDIO_LATENTS,),
    "audio-inpaint": (AUDIO_LATENTS, AUDIO_MASKS),
    "a2a-ic": (AUDIO_LATENTS, REFERENCE_AUDIO_LATENTS),
    "av2av-ic": (LATENTS, AUDIO_LATENTS, REFERENCE_LATENTS, REFERENCE_AUDIO_LATENTS),
    "image": (LATENTS,),
    "video": (LATENTS,),
}
#: the modes that generate or condition on audio: the LTX-2 audio connector runs on their prompts,
#: so their conditions need ``audio_prompt_embeds``
AUDIO_MODES = frozenset(m for m, dirs in MODES.items() if AUDIO_LATENTS in dirs)
#: the stamp's key naming the mode a tree was made for
MODE_KEY = "mode"

VIDEO_PROMPT_EMBEDS = "video_prompt_embeds"
AUDIO_PROMPT_EMBEDS = "audio_prompt_embeds"
PROMPT_ATTENTION_MASK = "prompt_attention_mask"
#: the older single embedding key the trainer still accepts (used for both modalities)
LEGACY_PROMPT_EMBEDS = "prompt_embeds"
LATENT_KEYS = ("latents", "num_frames", "height", "width", "fps")
AUDIO_LATENT_KEYS = ("latents", "num_time_steps", "frequency_bins", "duration")
CONDITION_KEYS = (VIDEO_PROMPT_EMBEDS, PROMPT_ATTENTION_MASK)
#: the keys each folder's dict must hold (``conditions/`` adds ``audio_prompt_embeds`` in
#: :data:`AUDIO_MODES`: :func:`required_keys`)
FOLDER_KEYS: dict[str, tuple[str, ...]] = {
    LATENTS: LATENT_KEYS, REFERENCE_LATENTS: LATENT_KEYS, AUDIO_LATENTS: AUDIO_LATENT_KEYS,
    REFERENCE_AUDIO_LATENTS: AUDIO_LATENT_KEYS, CONDITIONS: CONDITION_KEYS, VIDEO_MASKS: ("mask",),
    AUDIO_MASKS: ("mask",)}

#: audio latent steps per second: 16000 Hz / hop 160 / 4x temporal downsampling (reference §3)
AUDIO_LATENT_STEPS_PER_SECOND = 25.0
#: the LTX video VAEs' temporal compression: F' latent frames hold (F' - 1) * 8 + 1 pixel frames
VIDEO_TEMPORAL_FACTOR = 8


def mirrored(relpath: str, source_name: str | None) -> str:
    """``clips/a.mp4`` -> ``clips/a.pt`` (prefixed by the source name when several sources feed it);
    refuses a path that would leave the tree. Not unique by itself (``x.jpg`` and ``x.png``, two table rows
    of one clip): a planned item's files are named by :func:`sample_rel`."""
    p = PurePosixPath(relpath).with_suffix(CACHE_EXT)
    if ".." in p.parts or p.is_absolute():
        raise ValueError(f"media path {relpath!r} cannot be mirrored inside .precomputed/")
    return str(PurePosixPath(source_name) / p) if source_name else str(p)


#: the folder a ``..`` of a media path becomes in the tree, and the one the root of an absolute path becomes:
#: only ``_`` (a WebDataset key drops both, as it drops ``..`` and a leading ``/``: :func:`tree_path`)
PARENT_FOLDER = "__"
ROOT_FOLDER = "_"


def tree_path(relpath: str) -> str:
    """``relpath`` as a path inside the tree that :func:`mirrored` takes: itself when it stays in the source's
    folder; else every ``..`` component is a :data:`PARENT_FOLDER` folder and an absolute path's root a
    :data:`ROOT_FOLDER` folder (``../shared/y.jpg`` -> ``__/shared/y.jpg``, ``/data/y.jpg`` -> ``_/data/y.jpg``,
    ``lnk/../y.jpg`` -> ``lnk/__/y.jpg``), so a file the user allowed from outside has a well-defined name that
    cannot leave the tree. Such a name is the spelling of a file inside the folder too (a real ``__/shared/
    y.jpg``), but both have the same planner key base (:func:`~shardsmith.formats.wds.key_base` turns ``.``
    and ``/`` into ``_`` and strips ``_`` at the ends), so the planner gives the plain key to at most one of
    them and :func:`sample_rel` names the other with its digest: the names stay unique (a ``..`` after the
    start, whose key base the ``__`` changes, always takes the digest)."""
    if not relpath:
        return relpath
    p = PurePosixPath(relpath)
    if ".." not in p.parts and not p.is_absolute():
        return relpath
    parts = [PARENT_FOLDER if part == ".." else part for part in p.parts]
    if p.is_absolute():
        parts[0] = ROOT_FOLDER
    return str(PurePosixPath(*parts))


#: the longest file name, in bytes, a tree's file may have: NAME_MAX of the common file systems (ext4, xfs,
#: btrfs, tmpfs, APFS), which a name the digest makes longer than its media's would pass (:func:`sample_rel`)
MAX_NAME_BYTES = 255


def sample_rel(relpath: str, tree_source: str | None, *, key: str, item_id: str, key_source: str | None) -> str:
    """The relative path of a planned item's file in every folder of its tree (``latents/``, ``conditions/``,
    ``reference_latents/``, masks, cameras: the trainer pairs them by it), unique within the plan and decided
    from it alone (the same on every run and resume, whatever the order items are written in).

    The mirrored path (:func:`mirrored` of :func:`tree_path`; ``tree_source``: the source's name when several
    sources feed the tree) when the item's sample ``key`` is the planner's key for its normalised path
    (``key_source``: the source's name when the recipe has several, as the planner prefixes keys); else the
    mirrored path with ``_<8 hex>`` before ``.pt`` (the digest :func:`~shardsmith.formats.wds.unique_key`
    appends: of the item id): ``x.jpg`` -> ``x.pt``, ``x.png`` planned after it -> ``x_1a2b3c4d.pt``. Items
    whose mirrored paths agree have the same planner key base (the same normalised path, or one spelled with
    ``..`` and one with ``__``: :func:`tree_path`; a path whose key base :func:`tree_path` changes never keeps
    the plain name), and the planner gives that key to at most one item: at most one keeps the plain name; the
    others' item ids differ, so do their digests. A name over :data:`MAX_NAME_BYTES` (a media name within a few
    bytes of the limit that takes the digest) has its stem cut, at a character, to fit beside ``_<8 hex>.pt``."""
    plain = mirrored(tree_path(relpath), tree_source)  # a path from outside the source's folder: inside the tree
    norm = PurePosixPath(relpath).as_posix() if relpath else relpath
    # (a ``..`` after a link, ``lnk/../y.jpg``, keys as ``lnk_y`` but lies at ``lnk/__/y``: never the plain name)
    p = PurePosixPath(plain)
    if (key == key_base(key_source, norm, item_id) == key_base(key_source, tree_path(norm), item_id)
            and len(p.name.encode("utf-8")) <= MAX_NAME_BYTES):
        return plain
    tail = f"{unique_key('', item_id)}{CACHE_EXT}"  # unique_key('', id) = "_<8 hex>"
    # (a stem within a few bytes of the limit, 251 of a 255-byte x.jpg: cut, at a character, to fit beside the tail)
    stem = p.stem.encode("utf-8")[:MAX_NAME_BYTES - len(tail)].decode("utf-8", "ignore")
    return str(p.with_name(f"{stem}{tail}"))


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


def mode_dirs(mode: str) -> list[str]:
    """The folders the trainer reads in ``mode`` (``conditions/`` included), in :data:`TRAINER_DIRS`
    order; refuses an unknown mode."""
    if mode not in MODES:
        raise ValueError(f"unknown LTX training mode {mode!r}; one of {', '.join(MODES)}")
    need = {CONDITIONS, *MODES[mode]}
    return [d for d in TRAINER_DIRS if d in need]


def required_keys(folder: str, mode: str) -> tuple[str, ...]:
    """The keys a ``folder`` dict must hold for the trainer in ``mode``."""
    keys = FOLDER_KEYS[folder]
    if folder == CONDITIONS and mode in AUDIO_MODES:
        keys = (*keys, AUDIO_PROMPT_EMBEDS)
    return keys


def infer_mode(present: list[str] | tuple[str, ...]) -> str:
    """The mode a tree with these folders most likely trains: joint audio+video (``t2v``, or
    ``av2av-ic`` with both reference folders) when it holds ``latents/`` and ``audio_latents/``;
    audio-only (``t2a``, ``a2a-ic``, ``audio-inpaint``) without ``latents/``; else video-only
    (``v2v-ic``, ``video-inpaint`` or ``video``)."""
    have = set(present)
    if AUDIO_LATENTS in have and LATENTS in have:
        return "av2av-ic" if {REFERENCE_LATENTS, REFERENCE_AUDIO_LATENTS} <= have else "t2v"
    if AUDIO_LATENTS in have:
        return "a2a-ic" if REFERENCE_AUDIO_LATENTS in have else "audio-inpaint" if AUDIO_MASKS in have else "t2a"
    return "v2v-ic" if REFERENCE_LATENTS in have else "video-inpaint" if VIDEO_MASKS in have else "video"


def pixel_frames(latent_frames: int, temporal: int = VIDEO_TEMPORAL_FACTOR) -> int:
    """The pixel frames ``F'`` latent frames decode to: ``(F' - 1) * temporal + 1``."""
    return (int(latent_frames) - 1) * int(temporal) + 1


#: a recipe's ``mode`` -> the LTX training mode of its tree (with audio latents, without); the
#: modes LTX does not have (image editing, camera-controlled video) are video or image trees
TREE_MODES: dict[str, tuple[str, str]] = {
    "t2i": ("image", "image"), "t2v": ("t2v", "video"), "i2v": ("i2v", "video"), "v2v-ic": ("v2v-ic", "v2v-ic"),
    "a2v": ("a2v", "a2v"), "v2a": ("v2a", "v2a"), "t2a": ("t2a", "t2a"), "video-inpaint": ("video-inpaint", "video-inpaint"),
    "audio-inpaint": ("audio-inpaint", "audio-inpaint"), "av2av-ic": ("av2av-ic", "av2av-ic"),
    "a2a-ic": ("a2a-ic", "a2a-ic"), "image-edit": ("image", "image"), "camera-video": ("video", "video")}


def tree_mode(mode: str, audio: bool) -> str:
    """The LTX training mode a ``.precomputed/`` tree built for recipe ``mode`` is for (``audio``: the
    tree has audio latents)."""
    return TREE_MODES[mode][0 if audio else 1]
