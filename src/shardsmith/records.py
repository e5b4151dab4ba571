"""Typed records passed between stages (sources -> plan -> split -> transform -> sinks).

Every status string has the shape ``written``, ``skipped:<reason>`` or ``failed:<reason>``;
``<reason>`` is a short snake_case code, and a separate human ``detail`` names the item and
the fix.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

WRITTEN = "written"

MEDIA_KINDS = ("image", "video", "audio", "other")


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
class Item:
    """One input as a source yields it, before probing.

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


@dataclass
class PlannedItem:
    """An item after probing and split assignment: one row of the ledger's ``items`` table."""

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


@dataclass
class SampleResult:
    """What the transform stage returns for one item and one output."""

    idx: int
    status: str  # WRITTEN | skipped:<r> | failed:<r>
    detail: str | None = None
    members: dict[str, bytes] | None = None  # suffix -> bytes (wds) or {"png": ...} (zip)
    info: dict[str, Any] = field(default_factory=dict)  # per-sample facts for json/manifest
    pixels: Any = None  # latent outputs: uint8 frames [F, H, W, 3] in their bucket, awaiting the encoder
