"""Pure geometry: sizes and crop boxes, no pixels touched.

Boxes are (left, top, right, bottom) in PIL's convention; sizes are (width, height).

:class:`Geometry` is the one geometry decision of an item for a bucketed output (bucket, resize,
crop, frame indices, fps), made once from the target's size by :func:`decide` and applied to
every role: :func:`for_partner` maps it onto a partner (a mask, a source, a reference) so that
the partner's pixels land exactly where the target's do, or refuses the partner.
"""

from __future__ import annotations

from dataclasses import dataclass

from shardsmith.records import ItemError
from shardsmith.transform.buckets import Bucket, ResizeCrop, resize_crop

#: the largest relative aspect-ratio difference between a partner and its target that is
#: resized onto the target's geometry (beyond it the partner would be stretched: refused)
ASPECT_TOLERANCE = 0.01


@dataclass(frozen=True)
class Geometry:
    """Resize the whole picture (``source_size``) to ``resize``, then keep ``crop`` (a box in
    resized coordinates); for a clip, take the source frames ``frame_indices`` shown at ``fps``.

    ``source_size`` is the upright size of the media this record applies to: the target's for
    the item's own decision, the partner's for :func:`for_partner`'s result (same resize, crop,
    frames and fps, so both land on the same output pixels).
    """

    source_size: tuple[int, int]
    resize: tuple[int, int]
    crop: tuple[int, int, int, int]
    bucket: Bucket | None = None
    frame_indices: tuple[int, ...] | None = None
    fps: float | None = None

    @property
    def out_size(self) -> tuple[int, int]:
        """(width, height) of the result: the crop box's size."""
        return self.crop[2] - self.crop[0], self.crop[3] - self.crop[1]

    @property
    def resize_crop(self) -> ResizeCrop:
        """The same decision as FastGen's ``cropping_params`` (:class:`ResizeCrop`)."""
        w, h = self.out_size
        return ResizeCrop(self.resize[0], self.resize[1], self.crop[0], self.crop[1], w, h)

    @property
    def source_box(self) -> tuple[float, float, float, float]:
        """The crop box in the source's own pixels (the region of this media that is kept)."""
        sx, sy = self.source_size[0] / self.resize[0], self.source_size[1] / self.resize[1]
        x0, y0, x1, y1 = self.crop
        return x0 * sx, y0 * sy, x1 * sx, y1 * sy


def decide(src_w: int, src_h: int, bucket: Bucket, *, frame_indices: list[int] | tuple[int, ...] | None = None,
           fps: float | None = None) -> Geometry:
    """The item's decision for ``bucket``: :func:`~shardsmith.transform.buckets.resize_crop`'s
    cover-resize and centred crop of a ``src_w`` x ``src_h`` target, with the clip's frame picks
    and fps when given."""
    rc = resize_crop(src_w, src_h, bucket.width, bucket.height)
    return Geometry(source_size=(src_w, src_h), resize=(rc.resize_w, rc.resize_h), crop=rc.box, bucket=bucket,
                    frame_indices=None if frame_indices is None else tuple(frame_indices), fps=fps)


def for_partner(geom: Geometry, role: str, width: int, height: int, *, frames: int | None = None,
                name: str = "the item") -> Geometry:
    """``geom`` applied to a partner of ``width`` x ``height`` (and ``frames`` frames, for a clip):
    the same resize, crop, frames and fps, from the partner's own size, so its crop box in its own
    pixels (:attr:`Geometry.source_box`) is the target's scaled by the size ratio.

    Raises :class:`ItemError` ``<role>_geometry_mismatch`` when the partner's aspect ratio differs
    from the target's by more than :data:`ASPECT_TOLERANCE` (it is never stretched), and
    ``<role>_too_short`` when a partner clip lacks a frame the target's indices take."""
    tw, th = geom.source_size
    if min(width, height) < 1 or abs((width / height) / (tw / th) - 1) > ASPECT_TOLERANCE:
        raise ItemError(f"{role}_geometry_mismatch",
                        f"{name}: its {role} is {width}x{height} but its target is {tw}x{th}: the aspect ratios "
                        f"differ by more than {ASPECT_TOLERANCE:.0%}, so the {role} cannot line up with the target; "
                        f"give a {role} of the target's shape (any size of the same aspect ratio)")
    if frames is not None and geom.frame_indices and max(geom.frame_indices) >= frames:
        raise ItemError(f"{role}_too_short",
                        f"{name}: its {role} has {frames} frames but the target's clip takes frame "
                        f"{max(geom.frame_indices)}; give a {role} as long as the target")
    return Geometry(source_size=(width, height), resize=geom.resize, crop=geom.crop, bucket=geom.bucket,
                    frame_indices=geom.frame_indices, fps=geom.fps)


def fit_max_side(w: int, h: int, max_side: int | None, upscale: bool = False) -> tuple[int, int]:
    """Size with the longer side equal to ``max_side`` (aspect kept, each side >= 1).

    Without ``upscale`` an image already within ``max_side`` keeps its size.
    """
    if max_side is None or (max(w, h) <= max_side and not upscale) or max(w, h) == max_side:
        return w, h
    s = max_side / max(w, h)
    return max(1, round(w * s)), max(1, round(h * s))


def center_square_box(w: int, h: int) -> tuple[int, int, int, int]:
    """EDM ``center-crop``: the centred square of side min(w, h) (numpy slice arithmetic)."""
    c = min(w, h)
    return ((w - c) // 2, (h - c) // 2, (w + c) // 2, (h + c) // 2)


def wide_crop_height(w: int, h: int, out_w: int) -> int:
    """EDM ``center-crop-wide``: rows kept so that the crop has the output's width/height ratio."""
    return int(round(out_w * h / w))


def wide_box(w: int, h: int, out_w: int) -> tuple[int, int, int, int] | None:
    """Row band kept by ``center-crop-wide`` at output width ``out_w``; None if too small."""
    ch = wide_crop_height(w, h, out_w)
    return (0, (h - ch) // 2, w, (h + ch) // 2)


def dhariwal_halvings(w: int, h: int, size: int) -> int:
    """How many BOX halvings ADM's crop does before the final bicubic resize."""
    n = 0
    while min(w, h) >= 2 * size:
        w, h = w // 2, h // 2
        n += 1
    return n


def dhariwal_resize(w: int, h: int, size: int) -> tuple[int, int]:
    """Size after ADM's final bicubic resize: the shorter side becomes ``size``."""
    s = size / min(w, h)
    return round(w * s), round(h * s)


def center_box(w: int, h: int, cw: int, ch: int) -> tuple[int, int, int, int]:
    """Top-left-biased centred crop of (cw, ch) out of (w, h), as ADM computes it."""
    x, y = (w - cw) // 2, (h - ch) // 2
    return (x, y, x + cw, y + ch)
