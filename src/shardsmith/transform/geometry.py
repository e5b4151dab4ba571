"""Pure geometry for image outputs: sizes and crop boxes, no pixels touched.

Boxes are (left, top, right, bottom) in PIL's convention; sizes are (width, height).
"""

from __future__ import annotations


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
