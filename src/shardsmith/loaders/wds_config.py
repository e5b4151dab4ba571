"""The WebDataset loader's typed config (:class:`WdsLoaderConfig`), its named constant strings
(``presets_map`` values) and the batch keys a config gives its video members.

``config.model_copy(update={...})`` makes variants; ``rank`` / ``world_size`` left ``None`` are
taken from ``torch.distributed`` when it is initialised (else 0 / 1).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from shardsmith.formats import wds as wds_layout
from shardsmith.loaders import decoders as dec

# The ``presets_map`` constants, byte-identical to FastGen v0.1.0's ``PRESET_CONSTANTS``
# (fastgen/datasets/wds_dataloaders.py; tests/test_fastgen_exact.py compares them with the values
# copied from that source). ``neg_prompt_wan`` is FastGen's English rendering of Wan 2.1's default
# negative prompt, not Wan's Chinese original: the same key gives the same string in both.
PRESETS: dict[str, str] = {
    "neg_prompt_wan": (
        "Bright tones, overexposed, static, blurred details, subtitles, style, works, paintings, images, "
        "static, overall gray, worst quality, low quality, JPEG compression residue, ugly, incomplete, "
        "extra fingers, poorly drawn hands, poorly drawn faces, deformed, disfigured, misshapen limbs, "
        "fused fingers, still picture, messy background, three legs, many people in the background, "
        "walking backwards"
    ),
    # Cosmos-Predict's default negative prompt
    "neg_prompt_cosmos": (
        "The video captures a series of frames showing ugly scenes, static with no motion, motion "
        "blur, over-saturation, shaky footage, low resolution, grainy texture, pixelated images, "
        "poorly lit areas, underexposed and overexposed scenes, poor color balance, washed out "
        "colors, choppy sequences, jerky movements, low frame rate, artifacting, color banding, "
        "unnatural transitions, outdated special effects, fake elements, unconvincing visuals, "
        "poorly edited content, jump cuts, visual noise, and flickering. Overall, the video is of "
        "poor quality."
    ),
    "empty_string": "",
}


def fastgen_files_root(shards: str | os.PathLike) -> str:
    """The folder FastGen v0.1.0 joins a relative ``files_map`` path to (``WDSLoader._load_file``:
    ``os.path.join(os.path.dirname(<first datatag's path>), path)``): the shard folder's *parent*
    (``/d/train`` -> ``/d``), or the folder itself when the path is written with a trailing
    ``/`` (``/d/train/`` -> ``/d/train``)."""
    return os.path.dirname(os.fspath(shards))


def resolve_files_path(path: str, files_root: str | os.PathLike) -> Path:
    """A ``files_map`` path as FastGen opens it: absolute as it is (no ``~`` expansion),
    relative joined to ``files_root`` (:func:`fastgen_files_root`)."""
    return Path(path if os.path.isabs(path) else os.path.join(os.fspath(files_root), path))


def files_ref(shards: str | os.PathLike, name: str) -> str:
    """The relative ``files_map`` path that FastGen's rule (and this loader's) resolves to the
    file ``name`` *inside* the shard folder ``shards``: ``train/neg_prompt_emb.npy`` for
    ``/d/train``, ``neg_prompt_emb.npy`` for ``/d/train/``."""
    s = os.fspath(shards)
    if s.endswith(("/", os.sep)):
        return name
    return os.path.join(os.path.basename(s), name)


FILTERS = ("score", "empty_keys")


class WdsLoaderConfig(BaseModel):
    """Everything the loader needs; ``config.model_copy(update={...})`` makes variants."""

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)

    shards: Path
    key_map: dict[str, str] = Field(default_factory=lambda: {"real": wds_layout.JPG, "condition": wds_layout.TXT})
    # output key -> constant file (.npy/.pth/.safetensors), loaded once. A relative path resolves
    # exactly as FastGen v0.1.0 resolves it: joined to ``files_root``, which defaults to
    # ``os.path.dirname(shards)`` as written: the shard folder's PARENT, or the folder itself
    # when ``shards`` is given as a string ending in ``/`` (:func:`fastgen_files_root`).
    files_map: dict[str, str] = Field(default_factory=dict)
    files_root: Optional[Path] = None
    presets_map: dict[str, str] = Field(default_factory=dict)
    filters: dict[str, dict[str, Any]] = Field(default_factory=dict)
    batch_size: int = Field(1, ge=1)
    num_workers: int = Field(0, ge=0)
    deterministic: bool = False
    shuffle_size: int = Field(1000, ge=0)
    seed: int = 0
    start_index: int = Field(0, ge=0)
    rank: Optional[int] = None  # None: torch.distributed rank if initialised, else 0
    world_size: Optional[int] = None  # None: torch.distributed world size if initialised, else 1
    partial: bool = False
    image_size: Optional[Union[int, tuple[int, int]]] = None
    # video members (mp4, webm, ...): the first ``num_frames`` frames (FastGen's
    # ``sequence_length``), each resized to cover ``video_size`` and centre-cropped, as float32
    # [3, T, H, W] in [-1, 1]; without ``video_size``, uint8 [T, H, W, 3]. ``video_size`` is
    # an int (square) or (H, W) like ``image_size``; FastGen's ``img_size`` is (W, H)
    num_frames: Optional[int] = Field(None, ge=1)
    video_size: Optional[Union[int, tuple[int, int]]] = None
    strict: bool = False  # True: a decode error raises instead of being counted and dropped
    # True: files_map / presets_map tensors reach each batch as a read-only broadcast view
    # (``constant.expand(B, ...)``, no copy, attached in the main process) instead of a [B, ...]
    # copy made in the worker and sent through shared memory. ``verify`` uses it: a repeated
    # float32 [77, 2048] negative embedding is 40 MB of copies per batch of 64. Leave it off for
    # training if the trainer writes into batch tensors in place.
    constants_as_views: bool = False
    allow_empty_rank: bool = False  # False: a rank with no sample at all raises at construction

    @model_validator(mode="before")
    @classmethod
    def _trailing_slash(cls, data):
        # Path("/d/train/") drops the "/" that FastGen's rule reads: keep what it means here
        if isinstance(data, dict) and data.get("files_root") is None:
            shards = data.get("shards")
            if isinstance(shards, str) and shards.endswith(("/", os.sep)) and len(shards) > 1:
                data = {**data, "files_root": fastgen_files_root(shards)}
        return data

    def constant_path(self, path: str) -> Path:
        """Where files_map's ``path`` is opened (FastGen's rule, see ``files_map``)."""
        root = self.files_root if self.files_root is not None else fastgen_files_root(self.shards)
        return resolve_files_path(path, root)

    @field_validator("key_map")
    @classmethod
    def _keys(cls, v):
        if not v:
            raise ValueError("key_map must map at least one batch key to a member suffix")
        for k, s in v.items():
            if k.startswith("__"):
                raise ValueError(f"batch key {k!r}: names starting with '__' are reserved")
            if not s or s.startswith(".") or "/" in s:
                raise ValueError(f"key_map[{k!r}] = {s!r} is not a member suffix like 'jpg' or 'latent.pth'")
            dec.check_supported(s)
        return v

    @field_validator("video_size")
    @classmethod
    def _video_size(cls, v):
        if v is None:
            return v
        sides = (v,) if isinstance(v, int) else tuple(v)
        if any(isinstance(x, bool) or int(x) < 1 for x in sides):
            raise ValueError(f"video_size must be a positive int (square) or (height, width) of positive "
                             f"ints, got {v!r}")
        return v

    @field_validator("presets_map")
    @classmethod
    def _presets(cls, v):
        for k, name in v.items():
            if name not in PRESETS:
                raise ValueError(f"presets_map[{k!r}] = {name!r}: unknown preset; known: {sorted(PRESETS)}")
        return v

    @field_validator("filters")
    @classmethod
    def _filters(cls, v):
        for name, kw in v.items():
            if name not in FILTERS:
                raise ValueError(f"unknown filter {name!r}; known: {list(FILTERS)}")
            allowed = {"score": {"threshold", "score_key"}, "empty_keys": {"keys"}}[name]
            bad = set(kw or {}) - allowed
            if bad:
                raise ValueError(f"filter {name!r}: unknown options {sorted(bad)}; allowed {sorted(allowed)}")
        return v

    @model_validator(mode="after")
    def _video(self):
        videos = video_keys(self.key_map)
        if videos and self.num_frames is None:
            k = videos[0]
            raise ValueError(f"key_map[{k!r}] = {self.key_map[k]!r} is a video member: set num_frames (frames "
                             "taken from the start of each clip, FastGen's sequence_length; the 'video' preset "
                             "uses 81) and usually video_size (H, W)")
        taken = set(self.key_map) | set(self.files_map) | set(self.presets_map)
        for k, ck in cropping_keys(self).items():
            if ck in taken:
                raise ValueError(f"batch key {ck!r} holds the cropping_params of video key {k!r}; rename the "
                                 f"other {ck!r} key")
        return self

    @model_validator(mode="after")
    def _ranks(self):
        if self.rank is None or self.world_size is None:
            r, w = _dist_rank_world()
            self.rank = r if self.rank is None else self.rank
            self.world_size = w if self.world_size is None else self.world_size
        if self.world_size < 1 or not (0 <= self.rank < self.world_size):
            raise ValueError(f"need 0 <= rank < world_size, got rank={self.rank}, world_size={self.world_size}")
        return self


def validated(config: "WdsLoaderConfig") -> "WdsLoaderConfig":
    """A validated copy of ``config``, however it was made: ``config.model_copy(update={...})`` (the pattern
    the README shows) does not run the validators, so a loader re-validates its config where it is built,
    and ``rank=2, world_size=2`` or ``batch_size=0`` gives the same ``ValidationError`` (a ``ValueError``)
    as ``preset_config(name, path, rank=2, world_size=2)``, instead of a misleading message later, a
    ``KeyError`` or an endless first ``next()``."""
    if not isinstance(config, WdsLoaderConfig):
        raise TypeError(f"a WdsLoaderConfig is needed (e.g. preset_config(name, path)), got {type(config).__name__}")
    return type(config).model_validate(config.model_dump())


def video_keys(key_map: dict[str, str]) -> list[str]:
    """Batch keys whose member is a video (decoded with ``num_frames`` / ``video_size``)."""
    return [k for k, s in key_map.items() if dec.last_ext(s) in dec.VIDEO_EXTS]


def cropping_keys(cfg: "WdsLoaderConfig") -> dict[str, str]:
    """``{video batch key: batch key of its cropping_params}`` when ``video_size`` is set: FastGen
    names it ``cropping_params``, or ``<key>_cropping_params`` when there are several video keys."""
    if cfg.video_size is None:
        return {}
    keys = video_keys(cfg.key_map)
    return {k: ("cropping_params" if len(keys) == 1 else f"{k}_cropping_params") for k in keys}


def _dist_rank_world() -> tuple[int, int]:
    try:
        import torch.distributed as dist  # noqa: PLC0415

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
    except Exception:  # noqa: BLE001
        pass
    return 0, 1

