"""Image-editing pairs in the raw ``wds`` output (issue 18): an item's ``source`` image through
exactly its target's resize and crop.

Runs in worker processes, inside :class:`~shardsmith.transform.samples.WdsSampleMaker`.

- :func:`wds_geometry` is the ``wds`` output's picture decision (``image.max_side``, or
  ``image.size`` by ``resize_mode``) as a :class:`~shardsmith.transform.geometry.Geometry`: the
  same sizes :func:`~shardsmith.transform.image.resize_max_side` and
  :func:`~shardsmith.transform.image.fixed_size` give the target, nothing else decided. ``border``'s
  padding is a crop box reaching outside the resized picture (negative ``left`` / ``top``), the
  outside filled with ``images.background``.
- :func:`apply_geometry` runs a decision on a picture with the target's operations (PIL Lanczos
  resize to ``resize``, then the crop box): on the target it gives the target's very pixels.
- :func:`cut_source` reads the item's ``source``, checks it against the plan's sha256, decodes it,
  maps the target's decision onto it with :func:`~shardsmith.transform.geometry.for_partner` (a
  source of another aspect ratio is ``failed:source_geometry_mismatch``) and applies it, so the
  source lands on the target's output pixels whatever its own resolution (a smaller source is
  enlarged to the target's resize: the pair is one size). Any failure is ``failed:source_<reason>``.
"""

from __future__ import annotations

from dataclasses import dataclass

from PIL import Image

from shardsmith.recipe import ImageEncoding
from shardsmith.records import ItemError, PlannedItem
from shardsmith.transform.geometry import Geometry, fit_max_side, for_partner
from shardsmith.transform.image import DecodedImage, decode_image

SOURCE = "source"


def wds_geometry(w: int, h: int, enc: ImageEncoding, upscale: bool) -> Geometry | None:
    """The ``wds`` output's decision for a ``w`` x ``h`` picture (None where ``image.size`` refuses
    it as too small), mirroring :func:`~shardsmith.transform.image.resize_max_side` /
    :func:`~shardsmith.transform.image.fixed_size` size for size."""
    if enc.size is None:
        rw, rh = fit_max_side(w, h, enc.max_side, upscale)
        return Geometry(source_size=(w, h), resize=(rw, rh), crop=(0, 0, rw, rh))
    size, mode = enc.size, enc.resize_mode
    if mode in ("center_crop", "keep_ratio"):
        short = min(w, h)
        if short < size and not upscale:
            return None
        rw, rh = w, h
        if short != size:
            scale = size / short
            rw, rh = (size, max(1, round(h * scale))) if w <= h else (max(1, round(w * scale)), size)
        crop = (0, 0, rw, rh)
        if mode == "center_crop" and (rw, rh) != (size, size):
            x, y = (rw - size) // 2, (rh - size) // 2
            crop = (x, y, x + size, y + size)
        return Geometry(source_size=(w, h), resize=(rw, rh), crop=crop)
    if mode != "border":
        raise ValueError(f"unknown resize_mode {mode!r}")
    long = max(w, h)
    rw, rh = w, h
    if long > size or (long < size and upscale):
        scale = size / long
        rw, rh = (size, max(1, round(h * scale))) if w >= h else (max(1, round(w * scale)), size)
    if (rw, rh) == (size, size):
        return Geometry(source_size=(w, h), resize=(rw, rh), crop=(0, 0, size, size))
    x, y = (size - rw) // 2, (size - rh) // 2  # the picture's place on the canvas
    return Geometry(source_size=(w, h), resize=(rw, rh), crop=(-x, -y, size - x, size - y))


def apply_geometry(img: Image.Image, geom: Geometry, background: tuple[int, int, int]) -> Image.Image:
    """``img`` (of ``geom.source_size``) resized to ``geom.resize`` (PIL Lanczos) and cut to
    ``geom.crop``; a box reaching outside the picture pads with ``background`` (``border``).
    ``img`` itself is returned when nothing changes."""
    if img.size != tuple(geom.source_size):
        raise ValueError(f"a geometry for {geom.source_size[0]}x{geom.source_size[1]} applied to a "
                         f"{img.width}x{img.height} picture")
    if img.size != tuple(geom.resize):
        img = img.resize(geom.resize, Image.Resampling.LANCZOS)
    x0, y0, x1, y1 = geom.crop
    if (x0, y0, x1, y1) == (0, 0, img.width, img.height):
        return img
    if x0 >= 0 and y0 >= 0 and x1 <= img.width and y1 <= img.height:
        return img.crop(geom.crop)
    canvas = Image.new("RGB", (x1 - x0, y1 - y0), tuple(background))
    canvas.paste(img, (-x0, -y0))
    return canvas


@dataclass
class SourceCut:
    """An item's source after the target's decision: its bytes as read, its decode, its decision
    (:func:`~shardsmith.transform.geometry.for_partner`'s, in its own size) and the picture to write
    (``image is dec.image`` when nothing changed)."""

    data: bytes
    dec: DecodedImage
    geom: Geometry
    image: Image.Image

    @property
    def changed(self) -> bool:
        return self.image is not self.dec.image


def cut_source(item: PlannedItem, target_geom: Geometry, *, max_pixels: int,
               background: tuple[int, int, int]) -> SourceCut:
    """The item's ``source`` through ``target_geom`` (see the module contract); raises
    :class:`ItemError` ``source_<reason>`` naming the item and the file."""
    ref = item.media[SOURCE]
    name = f"{item.item_id}: its source {ref.relpath}"
    if ref.kind != "image":
        raise ItemError(f"source_unsupported_kind_{ref.kind}",
                        f"{name} is {ref.kind} media; an image output's source is an image")
    from shardsmith.transform.samples import read_verified  # (samples imports this module)

    data = read_verified(ref.path, ref.sha256, name, prefix="source_")
    try:
        dec = decode_image(data, name=name, max_pixels=max_pixels, background=background)
    except ItemError as e:
        raise ItemError(f"source_{e.reason}", e.detail) from None
    geom = for_partner(target_geom, SOURCE, *dec.image.size, name=item.item_id)
    out = apply_geometry(dec.image, geom, background)
    if out.size != target_geom.out_size:  # for_partner keeps resize and crop: a bug if ever seen
        raise AssertionError(f"{name} came out {out.size}, its target {target_geom.out_size}")
    return SourceCut(data=data, dec=dec, geom=geom, image=out)


def source_facts(item: PlannedItem, cut: SourceCut, member: str, passthrough: bool) -> dict:
    """The ``json`` member's record of a pair's source (``partners.source``): its file, bytes,
    sizes, the decision applied (``resize``, ``crop`` in resized pixels, ``source_box`` in its own
    pixels) and whether its bytes were written unchanged."""
    ref = item.media[SOURCE]
    return {"member": member, "path": ref.relpath, "sha256": ref.sha256, "original_size": list(cut.dec.source_size),
            "size": list(cut.image.size), "resize": list(cut.geom.resize), "crop": list(cut.geom.crop),
            "source_box": [round(v, 3) for v in cut.geom.source_box], "passthrough": passthrough,
            "notes": cut.dec.notes}
