"""Per-output sample makers: one :class:`PlannedItem` in, one :class:`SampleResult` out.

Makers run in worker processes; they read the item's bytes, check them against the sha256
recorded at plan time (a file changed since planning is ``failed:changed_since_plan``),
decode, apply the output's geometry and encode. They never write files.
"""

from __future__ import annotations

import hashlib
import json
from typing import NamedTuple

import numpy as np

from shardsmith.formats.wds import source_member
from shardsmith.records import WRITTEN, ItemError, PlannedItem, SampleResult, SourceInfo
from shardsmith.sources import paths
from shardsmith.recipe import ImageRules, WdsOutput, ZipOutput
from shardsmith.transform.image import (decode_image, edm_transform, encode_image, fixed_size, passthrough_ok,
                                        resize_max_side)
from shardsmith.transform.pairs import SOURCE, SourceCut, cut_source, source_facts, wds_geometry


def read_verified(path: str, sha256: str | None, name: str, prefix: str = "") -> bytes:
    """The bytes of ``path``: ``<prefix>vanished`` when it is gone since the plan, ``<prefix>not_a_regular_file``
    when it is now a pipe or a device (never read), ``<prefix>unreadable`` when it cannot be read otherwise,
    ``<prefix>changed_since_plan`` when they are not the ``sha256`` the plan hashed (:class:`ItemError`, naming
    ``name``)."""
    try:
        with paths.open_regular(path) as f:
            data = f.read()
    except paths.NotRegularFile as exc:
        raise ItemError(f"{prefix}{paths.NOT_REGULAR}", paths.not_regular_error(f"{name}: {path}", exc.what)[1]) from None
    except OSError as exc:
        reason = paths.read_error_reason(exc.errno)
        fix = "; re-run once the folder is stable" if reason == "vanished" else ""
        raise ItemError(f"{prefix}{reason}", f"{name}: cannot read {path}: {exc}{fix}") from None
    if sha256 is not None and hashlib.sha256(data).hexdigest() != sha256:
        raise ItemError(f"{prefix}changed_since_plan", f"{name}: {path} changed after it was planned; "
                        "re-run with --overwrite to plan again")
    return data


def read_checked(item: PlannedItem) -> bytes:
    """The target's bytes, as planned (:func:`read_verified`)."""
    return read_verified(item.path, item.sha256, item.item_id)


def _not_image(item: PlannedItem) -> ItemError:
    return ItemError(f"unsupported_kind_{item.kind}",
                     f"{item.item_id} is {item.kind} media, which this image output does not take; "
                     "limit the output's sources: or use a video/audio output", skip=True)


def _check_min_size(item: PlannedItem, size: tuple[int, int], rules: ImageRules) -> None:
    if min(size) < rules.min_size:
        raise ItemError("too_small", f"{item.item_id} is {size[0]}x{size[1]}, below images.min_size={rules.min_size}",
                        skip=True)


class _Pair(NamedTuple):
    cut: SourceCut
    why_not: str | None  # the pair's passthrough verdict (None: both members keep their bytes)


class WdsSampleMaker:
    """Members ``jpg|png|webp`` (+ ``txt``, ``cls``, ``json``) for one WebDataset sample; an item
    with an edit ``source`` also gets ``src.<ext>`` (:func:`~shardsmith.formats.wds.source_member`):
    the source through the target's very resize and crop, same format and quality, same key, its
    facts in the json's ``partners.source`` (see :meth:`_source` for passthrough)."""

    def __init__(self, output: WdsOutput, rules: ImageRules, sources: list[SourceInfo]):
        self.o, self.rules, self.sources = output, rules, sources

    def __call__(self, item: PlannedItem) -> SampleResult:
        try:
            if item.kind != "image":
                raise _not_image(item)
            data = read_checked(item)
            dec = decode_image(data, name=item.item_id, max_pixels=self.rules.max_pixels,
                               background=self.rules.background)
            img = dec.image
            _check_min_size(item, img.size, self.rules)
            enc = self.o.image
            resized = self._geometry(item, img)
            why_not = passthrough_ok(dec, enc.format, resized is not img) if enc.passthrough else "not asked"
            pair = self._source(item, img, resized, why_not) if SOURCE in item.media else None
            if pair is not None:
                why_not = pair.why_not
            payload = data if why_not is None else encode_image(resized, enc.format, enc.quality)
        except ItemError as e:
            return SampleResult(idx=item.idx, status=e.status, detail=e.detail)
        members = {enc.format: payload}
        if pair is not None:
            members[source_member(enc.format)] = (pair.cut.data if why_not is None else
                                                  encode_image(pair.cut.image, enc.format, enc.quality))
        if item.caption is not None:
            members["txt"] = item.caption.encode("utf-8")
        if item.label is not None:
            members["cls"] = str(item.label).encode()
        info = {"size": list(resized.size)}
        if self.o.metadata:
            src = self.sources[item.source]
            meta = {
                "id": item.item_id, "source": src.name, "path": item.relpath, "sha256": item.sha256,
                "original_size": list(dec.source_size), "size": list(resized.size),
                "label": item.label, "label_name": item.label_name, "license": src.license, "origin": src.origin,
                "passthrough": why_not is None, "notes": dec.notes, "meta": item.meta,
            }
            if pair is not None:  # "source" is the dataset's name: the edit's source is a partner
                meta["partners"] = {SOURCE: source_facts(item, pair.cut, source_member(enc.format), why_not is None)}
            members["json"] = json.dumps(meta, sort_keys=True, ensure_ascii=False).encode("utf-8")
        return SampleResult(idx=item.idx, status=WRITTEN, members=members, info=info)

    def _source(self, item: PlannedItem, img, resized, why_not: str | None) -> _Pair:
        """The item's edit source through the target's decision (:mod:`~shardsmith.transform.pairs`),
        and the pair's passthrough verdict: both members keep their bytes only when both could
        (the target's ``why_not`` is None and the source is of the output's format, its pixels
        untouched by decode and decision); otherwise both are encoded at ``image.quality``, so a
        pair never mixes original bytes with re-encoded ones."""
        enc = self.o.image
        geom = wds_geometry(*img.size, enc, self.rules.upscale)
        if geom is None or geom.out_size != resized.size:  # the same decision the target just took
            raise AssertionError(f"{item.item_id}: wds_geometry disagrees with the target's picture")
        cut = cut_source(item, geom, max_pixels=self.rules.max_pixels, background=self.rules.background)
        if why_not is None and enc.passthrough:
            src_why = passthrough_ok(cut.dec, enc.format, cut.changed)
            if src_why is not None:
                why_not = f"its source: {src_why}"
        return _Pair(cut, why_not)

    def _geometry(self, item: PlannedItem, img):
        """The picture this output writes: ``image.max_aspect`` screened (skipped:aspect_ratio), then
        ``image.size`` by ``resize_mode`` (img2dataset's modes) or ``image.max_side``."""
        enc = self.o.image
        w, h = img.size
        if enc.max_aspect is not None and max(w, h) > enc.max_aspect * min(w, h):
            raise ItemError("aspect_ratio", f"{item.item_id} is {w}x{h}, aspect ratio {max(w, h) / min(w, h):.3g}, "
                            f"above image.max_aspect={enc.max_aspect:g}", skip=True)
        if enc.size is None:
            return resize_max_side(img, enc.max_side, self.rules.upscale)
        out = fixed_size(img, enc.size, enc.resize_mode, self.rules.upscale, self.rules.background)
        if out is None:
            raise ItemError("too_small", f"{item.item_id} is {w}x{h}, its shorter side below image.size={enc.size} "
                            f"({enc.resize_mode}); set images.upscale: true to enlarge it, or use resize_mode: "
                            "border", skip=True)
        return out


class ZipSampleMaker:
    """One uncompressed-PNG-ready picture at the ZIP's resolution (EDM transforms)."""

    def __init__(self, output: ZipOutput, rules: ImageRules, sources: list[SourceInfo], labelled: bool):
        self.o, self.rules, self.labelled = output, rules, labelled

    def __call__(self, item: PlannedItem) -> SampleResult:
        from io import BytesIO

        try:
            out = self.picture(item)
        except ItemError as e:
            return SampleResult(idx=item.idx, status=e.status, detail=e.detail)
        buf = BytesIO()
        out.save(buf, format="png", compress_level=0, optimize=False)
        return SampleResult(idx=item.idx, status=WRITTEN, members={"png": buf.getvalue()},
                            info={"label": item.label})

    def picture(self, item: PlannedItem):
        """The item's RGB picture at the output's resolution (a PIL image); raises :class:`ItemError`
        for an item the output skips or fails."""
        w, h = self.o.size
        if item.kind != "image":
            raise _not_image(item)
        if self.labelled and item.label is None:
            raise ItemError("no_label", f"{item.item_id} has no class label but this ZIP is class-conditional; "
                            "put it in a class sub-folder or give it a label", skip=True)
        dec = decode_image(read_checked(item), name=item.item_id, max_pixels=self.rules.max_pixels,
                           background=self.rules.background)
        img = dec.image
        upscale = self.rules.upscale if self.o.upscale is None else self.o.upscale
        _check_min_size(item, img.size, self.rules)
        small = img.width < w if self.o.transform == "center-crop-wide" else min(img.size) < w
        if small and not upscale:
            raise ItemError("too_small", f"{item.item_id} is {img.width}x{img.height}, smaller than the "
                            f"ZIP resolution {w}x{h}; set upscale: true on this output to enlarge it", skip=True)
        out = edm_transform(img, self.o.transform, w, h)
        if out is None:
            raise ItemError("too_small", f"{item.item_id} is {img.width}x{img.height}: too small for "
                            f"center-crop-wide at {w}x{h}", skip=True)
        return out


class LatentZipPixelMaker(ZipSampleMaker):
    """A ``latent_zip`` item's pixels for the VAE: the image ZIP's picture (the same EDM transform)
    as uint8 ``[1, S, S, 3]`` in ``res.pixels``, in the one bucket ``SxSx1`` that the encoder's
    scheduler batches by; ``info["crop"]`` names the transform (two outputs share an encoded item
    only when bucket and crop agree)."""

    def __call__(self, item: PlannedItem) -> SampleResult:
        try:
            out = self.picture(item)
        except ItemError as e:
            return SampleResult(idx=item.idx, status=e.status, detail=e.detail)
        w, h = out.size
        return SampleResult(idx=item.idx, status=WRITTEN, pixels=np.asarray(out, dtype=np.uint8)[None],
                            info={"bucket": f"{w}x{h}x1", "label": item.label,
                                  "crop": {"transform": self.o.transform, "resolution": list(self.o.size)}})
