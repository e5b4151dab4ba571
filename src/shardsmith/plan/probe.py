"""Probe one item once: sha256 of its bytes, size, media kind and (for images) header facts.

Images are opened, not decoded (decoding is the transform's job); an empty file, a non-image
or a decompression bomb fails here for every output at once.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from shardsmith.records import Item, ItemError
from shardsmith.sources.base import media_kind
from shardsmith.transform.image import identify


@dataclass
class Probe:
    sha256: str | None = None
    size_bytes: int | None = None
    kind: str = "other"
    width: int | None = None
    height: int | None = None
    image_format: str | None = None
    mode: str | None = None
    status: str = "ok"
    detail: str | None = None


def read_and_hash(path: str, keep: bool) -> tuple[bytes | None, str, int]:
    """(bytes if ``keep`` else None, sha256 hex, size). Large non-kept files stream in 1 MiB chunks."""
    if keep:
        with open(path, "rb") as f:
            data = f.read()
        return data, hashlib.sha256(data).hexdigest(), len(data)
    h, n = hashlib.sha256(), 0
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
            n += len(chunk)
    return None, h.hexdigest(), n


def probe_item(item: Item, max_pixels: int) -> Probe:
    pr = Probe(kind=media_kind(item.relpath or item.path))
    if item.error is not None and item.error[0] in ("missing_file", "no_media_path", "path_outside_table_dir",
                                                    "bad_row"):
        pr.status, pr.detail = f"failed:{item.error[0]}", item.error[1]
        return pr
    try:
        data, pr.sha256, pr.size_bytes = read_and_hash(item.path, keep=pr.kind == "image")
    except OSError as exc:
        pr.status, pr.detail = "failed:unreadable", f"{item.item_id}: cannot read {item.path}: {exc}"
        return pr
    if item.error is not None:
        pr.status, pr.detail = f"failed:{item.error[0]}", item.error[1]
        return pr
    if pr.kind == "image":
        try:
            img = identify(data, name=item.item_id, max_pixels=max_pixels)
            pr.width, pr.height = img.size
            pr.image_format, pr.mode = img.format, img.mode
        except ItemError as e:
            pr.status, pr.detail = e.status, e.detail
    return pr
