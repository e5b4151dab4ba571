"""Typed records passed between stages (sources -> plan -> split -> transform -> sinks).

Every status string has the shape ``written``, ``skipped:<reason>`` or ``failed:<reason>``;
``<reason>`` is a short snake_case code, and a separate human ``detail`` names the item and
the fix.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from typing import Any, NamedTuple

WRITTEN = "written"

MEDIA_KINDS = ("image", "video", "audio", "other")

#: the roles an item's media can play; ``target`` is the item's own media (what ``Item.path`` names)
ROLES = ("target", "source", "reference", "mask", "audio", "camera")
TARGET = "target"
PARTNER_ROLES = ROLES[1:]  # every role but the target
#: the planned kind of an item that has a caption and no media (a captions-only table row)
TEXT_KIND = "text"
#: the reason of a captions-only row whose caption is empty (it has nothing else)
NO_CAPTION = "no_caption"
#: the start of the detail of a sample written without audio (its output writes audio, not required)
NO_AUDIO = "no audio: "


class ItemError(Exception):
    """A per-item problem: becomes ``failed:<reason>`` (or ``skipped:<reason>``) in the ledger.

    ``reason`` is a short code (``truncated``, ``not_an_image`` ...); ``detail`` is the message
    a person reads, naming the item and what to do about it.
    """

    def __init__(self, reason: str, detail: str, *, skip: bool = False):
        super().__init__(detail)
        self.reason = reason
        self.detail = detail
        self.skip = skip

    @property
    def status(self) -> str:
        return f"{'skipped' if self.skip else 'failed'}:{self.reason}"


@dataclass(frozen=True)
class SourceInfo:
    """One declared source, as resolved from the recipe."""

    index: int
    name: str
    path: str  # absolute
    kind: str  # "folder" | "table"
    origin: str | None
    license: str | None
    label_names: tuple[str, ...] | None = None  # id -> name, contiguous 0..K-1


@dataclass
class MediaRef:
    """One media file of an item, in one role: where it is and what the planner's probe learnt.

    ``path`` is absolute (symlinks resolved), ``relpath`` as the source names it. The probed facts
    (``kind`` from the extension, then ``size_bytes`` / ``sha256`` of the bytes and, for images,
    the header's ``width`` / ``height`` / ``image_format`` / ``mode``) are None until probed.
    ``audio``: when an output writes audio, the plan's probe of the file's first audio stream
    (``AudioProbe.to_json()``: rate, channels, layout, duration, codec, stream) or ``{"none": reason}``.
    """

    path: str
    relpath: str
    kind: str = "other"
    size_bytes: int | None = None
    sha256: str | None = None
    width: int | None = None
    height: int | None = None
    image_format: str | None = None
    mode: str | None = None
    audio: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        """The fields as a dict, in field order (what ``asdict`` gives: ``audio`` holds probe facts, flat
        JSON values, so a shallow copy of it is a full one); called once per planned row."""
        d = {k: getattr(self, k) for k in _MEDIA_FIELDS}
        if self.audio is not None:
            d["audio"] = dict(self.audio)
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> MediaRef:
        return cls(**d)


_MEDIA_FIELDS = tuple(f.name for f in fields(MediaRef))


def media_to_json(media: dict[str, MediaRef]) -> str:
    """The ledger's ``media`` column: ``{role: MediaRef fields}`` in role order."""
    return json.dumps({r: media[r].to_json() for r in ROLES if r in media}, ensure_ascii=False)


def media_from_json(text: str) -> dict[str, MediaRef]:
    return {r: MediaRef.from_json(d) for r, d in json.loads(text).items()}


@dataclass
class Item:
    """One input as a source yields it, before probing.

    ``path`` / ``relpath`` are the target's (``""`` for a captions-only row); ``media`` holds the
    file of every role the source gave (see :data:`ROLES`).

    ``error`` is set when the source already knows the item is unusable (missing file,
    undecodable caption); such items are still planned and accounted for.
    """

    item_id: str  # unique across the build: "<source name>/<relative path or row>"
    source: int
    path: str  # absolute media path ("" if the row had none)
    relpath: str  # path as the source names it, forward slashes
    caption: str | None = None
    label: int | None = None
    label_name: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    error: tuple[str, str] | None = None  # (reason, detail)
    media: dict[str, MediaRef] = field(default_factory=dict)  # role -> file; the target is ``path``

    def __post_init__(self) -> None:
        """``path`` and ``media["target"]`` name the same file: an item built with only a
        ``path`` gets its target ref here. An item with neither has no media (a caption only)."""
        if self.path and TARGET not in self.media:
            self.media = {TARGET: MediaRef(self.path, self.relpath), **self.media}


@dataclass
class PlannedItem:
    """An item after probing and split assignment: one row of the ledger's ``items`` table.

    ``path`` and the flat probe fields (``sha256`` ... ``mode``) are the target's; ``media``
    holds every role's file with its probed facts (empty for a captions-only item, whose
    ``kind`` is ``text``)."""

    idx: int  # position in plan order
    item_id: str
    key: str  # unique, dot-free sample key
    source: int
    path: str
    relpath: str
    caption: str | None
    label: int | None
    label_name: str | None
    meta: dict[str, Any]
    sha256: str | None
    size_bytes: int | None
    kind: str
    width: int | None
    height: int | None
    image_format: str | None
    mode: str | None
    split: str
    plan_status: str  # "ok" | "skipped:<reason>" | "failed:<reason>"
    detail: str | None = None
    dup_of: str | None = None
    media: dict[str, MediaRef] = field(default_factory=dict)  # role -> probed file; the flat fields are the target's


@dataclass
class TeacherInput:
    """What the teacher samples for one prompt (``shardsmith distill``): the sample's latent shape and,
    with ``distill.text: source``, the prompt's precomputed embedding ``[L, D]`` (None: the text encoder
    makes it)."""

    shape: tuple[int, ...]
    emb: Any = None


@dataclass(frozen=True)
class Waveform:
    """A sample's audio on its way to the audio encoder: float32 ``samples`` ``[2, N]`` (stereo) or ``[1, N]``
    (mono, which the encoder duplicates to both channels on its device, as LTX-2 does) at ``rate`` Hz. The
    encoder resamples it to its own rate first when ``rate`` differs (``audio.resampler: sinc``: the window
    is cut at the source's rate, as LTX-2 does); with ``audio.resampler: ffmpeg`` it comes stereo at the
    encoder's rate already."""

    samples: Any
    rate: int

    def length_at(self, rate: int) -> int:
        """Its sample count once at ``rate`` Hz (:func:`~shardsmith.transform.audio.resampled_length`)."""
        from shardsmith.transform.audio import resampled_length

        return resampled_length(int(self.samples.shape[-1]), self.rate, rate)


@dataclass
class SampleResult:
    """What the transform stage returns for one item and one output."""

    idx: int
    status: str  # WRITTEN | skipped:<r> | failed:<r>
    detail: str | None = None
    members: dict[str, bytes] | None = None  # suffix -> bytes (wds) or {"png": ...} (zip)
    info: dict[str, Any] = field(default_factory=dict)  # per-sample facts for json/manifest
    pixels: Any = None  # latent outputs: uint8 frames [F, H, W, 3] in their bucket, awaiting the encoder
    audio: Waveform | None = None  # outputs with audio latents: the sample's waveform, awaiting the audio encoder
    partners: Any = None  # latent outputs of a mode with partners: {name: uint8 [F, H, W, 3]}, awaiting the VAE
    conditions: Any = None  # arrays written as they are (a latent-grid mask, camera rows): {name: ndarray}
    audio_reference: Waveform | None = None  # IC-LoRA with audio: the reference's waveform, awaiting the audio encoder
    teacher: TeacherInput | None = None  # shardsmith distill: what the teacher samples, awaiting it


class UnitFile(NamedTuple):
    """One file of a unit that writes one file per bucket (name relative to the output folder)."""

    name: str
    bucket: str
    count: int
    nbytes: int
    sha256: str
    frames_used: int = 0
    frames_available: int = 0
    area_kept: float = 0.0  # sum over its samples of the share of the source area the crop keeps


class Written(NamedTuple):
    """What a sink's ``write_unit`` wrote: the unit's name, bytes and sha256 (one file: the file's;
    several: a hash over ``files``), and its files when there are several."""

    name: str
    nbytes: int
    sha256: str
    files: tuple[UnitFile, ...] = ()
