"""Pure arithmetic for video / image buckets: W x H x F choice, resize + crop, frame picks.

No I/O and no pixels: every function maps numbers to numbers so it can be tested alone.

Conventions (as in the LTX trainer and FastGen, see shared/reference/):

- A bucket is ``W x H x F`` (width, height, frames); F = 1 is an image bucket.
- A model with spatial compression ``s`` and temporal compression ``t`` can represent
  W, H that are multiples of ``s`` and F = 1 + t*k (e.g. 32 and 8 for the LTX video VAE).
- Bucket choice is LTX's rule: among buckets with F <= the clip's frame count, minimise
  (|log(w/h) - log(bw/bh)|, -F, -area): closest aspect ratio, then most frames, then
  largest area.
- Resize + crop is an aspect-preserving resize that covers the bucket, then a centred
  crop; :class:`ResizeCrop` uses FastGen's ``cropping_params`` field names.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass

from shardsmith.errors import UserError

__all__ = [
    "Bucket",
    "BucketError",
    "parse_buckets",
    "validate_buckets",
    "choose_bucket",
    "ResizeCrop",
    "resize_crop",
    "latent_frames",
    "latent_size",
    "frame_indices",
    "available_frames",
    "effective_fps",
]

_TOKEN = re.compile(r"^\s*(\d+)\s*[xX]\s*(\d+)\s*[xX]\s*(\d+)\s*$")


class BucketError(UserError, ValueError):
    """A bucket spec that cannot be parsed or that the model cannot represent."""


@dataclass(frozen=True)
class Bucket:
    """One target shape: ``width`` x ``height`` pixels, ``frames`` frames (1 = image)."""

    width: int
    height: int
    frames: int

    def __str__(self) -> str:
        return f"{self.width}x{self.height}x{self.frames}"

    @property
    def area(self) -> int:
        return self.width * self.height

    @property
    def aspect(self) -> float:
        return self.width / self.height

    @classmethod
    def parse(cls, text: str) -> Bucket:
        """Parse ``"WxHxF"`` (e.g. ``"960x544x49"``; ``X`` and spaces tolerated).

        Raises :class:`BucketError` naming the token when it is not three positive
        integers.
        """
        if not isinstance(text, str):
            raise BucketError(f"bucket {text!r}: expected a string 'WxHxF' such as '960x544x49'")
        m = _TOKEN.match(text)
        if not m:
            raise BucketError(
                f"bucket {text.strip()!r} is not 'WxHxF' (width x height x frames, e.g. '960x544x49'; "
                "use frames 1 for images)"
            )
        w, h, f = (int(g) for g in m.groups())
        zero = [n for n, v in (("width", w), ("height", h), ("frames", f)) if v < 1]
        if zero:
            raise BucketError(f"bucket {text.strip()!r}: {', '.join(zero)} must be >= 1")
        return cls(w, h, f)


def parse_buckets(spec: str | Sequence[str]) -> list[Bucket]:
    """Parse ``"960x544x49;512x512x1"`` (``;``-separated) or a list of ``"WxHxF"`` strings.

    Order is kept. Empty tokens from a trailing ``;`` are ignored; an empty spec, a bad
    token or a bucket listed twice raises :class:`BucketError` naming the token.
    """
    if isinstance(spec, str):
        tokens = [t for t in spec.split(";") if t.strip()]
    elif isinstance(spec, Iterable):
        tokens = list(spec)
        for t in tokens:
            if isinstance(t, str) and ";" in t:
                raise BucketError(f"bucket {t!r}: give one 'WxHxF' per list entry, or one ';'-separated string")
    else:
        raise BucketError(f"buckets must be a 'WxHxF;...' string or a list of them, not {type(spec).__name__}")
    if not tokens:
        raise BucketError("no buckets given: expected e.g. '960x544x49' or '960x544x49;512x512x1'")
    out: list[Bucket] = []
    for t in tokens:
        b = t if isinstance(t, Bucket) else Bucket.parse(t)
        if b in out:
            raise BucketError(f"bucket {b} is listed twice")
        out.append(b)
    return out


def _nearest_multiples(v: int, m: int) -> list[int]:
    """Closest first; only positive candidates."""
    lo, hi = (v // m) * m, (v // m + 1) * m
    cands = [c for c in (lo, hi) if c >= m]
    return sorted(cands, key=lambda c: (abs(c - v), c))


def _nearest_frames(f: int, t: int) -> list[int]:
    """Nearest valid 1 + t*k values to ``f``, closest first."""
    k = (f - 1) // t if f >= 1 else 0
    cands = sorted({1 + t * k, 1 + t * (k + 1)})
    return sorted(cands, key=lambda c: (abs(c - f), c))


def _or(vals: list[int]) -> str:
    return " or ".join(str(v) for v in vals)


def validate_buckets(buckets: Iterable[Bucket], spatial: int, temporal: int) -> None:
    """Check every bucket is representable by a model with these compression factors.

    W and H must be multiples of ``spatial``; F must be 1 + ``temporal``*k (F = 1, an
    image, is always allowed). Raises :class:`BucketError` listing every bad bucket with
    the nearest valid values, closest first, e.g. ``bucket 500x512x48: width 500 is not a
    multiple of 32 (nearest 512 or 480); frames 48 is not 1 + 8k (nearest 49 or 41)``.
    """
    if spatial < 1 or temporal < 1:
        raise BucketError(f"compression factors must be >= 1 (spatial={spatial}, temporal={temporal})")
    problems = []
    for b in buckets:
        msgs = []
        for name, v in (("width", b.width), ("height", b.height)):
            if v % spatial:
                msgs.append(
                    f"{name} {v} is not a multiple of {spatial} (nearest {_or(_nearest_multiples(v, spatial))})"
                )
        if (b.frames - 1) % temporal:
            msgs.append(
                f"frames {b.frames} is not 1 + {temporal}k (nearest {_or(_nearest_frames(b.frames, temporal))})"
            )
        if msgs:
            problems.append(f"bucket {b}: " + "; ".join(msgs))
    if problems:
        raise BucketError("\n".join(problems))


def choose_bucket(w: int, h: int, n_frames: int, buckets: Iterable[Bucket]) -> Bucket | None:
    """LTX's bucket rule for a ``w`` x ``h`` clip with ``n_frames`` usable frames.

    Eligible: buckets with ``frames <= n_frames``. Among them minimise
    (|log(w/h) - log(bw/bh)|, -frames, -area). Returns None when nothing is eligible
    (the caller skips the item as too short; LTX raised and crashed here instead).
    Aspect distances equal to within 1e-9 count as ties.
    """
    if w < 1 or h < 1:
        raise ValueError(f"bad source size {w}x{h}")
    la = math.log(w / h)
    best, best_key = None, None
    for b in buckets:
        if b.frames > n_frames:
            continue
        key = (round(abs(la - math.log(b.width / b.height)), 9), -b.frames, -b.area)
        if best_key is None or key < best_key:
            best, best_key = b, key
    return best


@dataclass(frozen=True)
class ResizeCrop:
    """Resize the whole source to ``resize_w`` x ``resize_h``, then keep the box at
    (``crop_x0``, ``crop_y0``) of size ``crop_w`` x ``crop_h``.

    Field names are FastGen's ``cropping_params``.
    """

    resize_w: int
    resize_h: int
    crop_x0: int
    crop_y0: int
    crop_w: int
    crop_h: int

    @property
    def box(self) -> tuple[int, int, int, int]:
        """The crop as a PIL box (left, top, right, bottom) in resized coordinates."""
        return (self.crop_x0, self.crop_y0, self.crop_x0 + self.crop_w, self.crop_y0 + self.crop_h)

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


def resize_crop(src_w: int, src_h: int, out_w: int, out_h: int) -> ResizeCrop:
    """Aspect-preserving resize covering ``out_w`` x ``out_h``, then a centred crop.

    scale = max(out_w/src_w, out_h/src_h); the resized size is the rounded scaled size,
    never smaller than the target on either side (so one side equals the target and the
    other is >= it). The crop is centred with floor division:
    ``crop_x0 = (resize_w - out_w) // 2``, ``crop_y0 = (resize_h - out_h) // 2``.
    """
    if min(src_w, src_h, out_w, out_h) < 1:
        raise ValueError(f"bad sizes: source {src_w}x{src_h}, target {out_w}x{out_h}")
    s = max(out_w / src_w, out_h / src_h)
    rw = max(out_w, round(src_w * s))
    rh = max(out_h, round(src_h * s))
    return ResizeCrop(rw, rh, (rw - out_w) // 2, (rh - out_h) // 2, out_w, out_h)


def latent_frames(frames: int, temporal: int) -> int:
    """Latent frame count ``1 + (frames - 1) // temporal``; refuses F that is not 1 + t*k."""
    if temporal < 1:
        raise ValueError(f"temporal compression must be >= 1, not {temporal}")
    if frames < 1 or (frames - 1) % temporal:
        near = _or(_nearest_frames(max(frames, 1), temporal))
        raise BucketError(f"frames {frames} is not 1 + {temporal}k (nearest {near})")
    return 1 + (frames - 1) // temporal


def latent_size(bucket: Bucket, spatial: int, temporal: int) -> tuple[int, int, int]:
    """Latent grid (F', H', W') of ``bucket``; refuses buckets the model cannot represent."""
    validate_buckets([bucket], spatial, temporal)
    return latent_frames(bucket.frames, temporal), bucket.height // spatial, bucket.width // spatial


def _ratio(src_fps: float, target_fps: float | None) -> float | None:
    """Source frames per output frame, or None for native rate."""
    if not (src_fps > 0):
        raise ValueError(f"source fps must be > 0, not {src_fps}")
    if target_fps is None:
        return None
    if not (target_fps > 0):
        raise ValueError(f"target fps must be > 0, not {target_fps}")
    if math.isclose(src_fps, target_fps, rel_tol=1e-6):
        return None
    return src_fps / target_fps


def _nearest(k: int, ratio: float) -> int:
    # round half up, with a tolerance so that exact halves from float noise agree
    return math.floor(k * ratio + 0.5 + 1e-9)


def frame_indices(
    n_src: int,
    src_fps: float,
    frames: int,
    target_fps: float | None = None,
    start: int = 0,
) -> list[int] | None:
    """Source frame indices making an output clip of ``frames`` frames.

    Native rate (``target_fps`` None or equal to ``src_fps``): ``[start, ..., start+frames-1]``.
    With ``target_fps``: output frame k shows time ``k / target_fps`` after source frame
    ``start``; its index is the source frame nearest that time,
    ``start + round(k * src_fps / target_fps)`` (halves round up). Down-sampling never
    repeats a frame; up-sampling repeats only as the rate requires. Returns None when the
    clip is too short (the last index would be >= ``n_src``).
    """
    if frames < 1:
        raise ValueError(f"frames must be >= 1, not {frames}")
    if start < 0 or n_src < 0:
        raise ValueError(f"start and n_src must be >= 0 (start={start}, n_src={n_src})")
    r = _ratio(src_fps, target_fps)
    if r is None:
        idx = list(range(start, start + frames))
    else:
        idx = [start + _nearest(k, r) for k in range(frames)]
    return idx if idx[-1] < n_src else None


def available_frames(n_src: int, src_fps: float, target_fps: float | None = None, start: int = 0) -> int:
    """How many output frames :func:`frame_indices` can make from ``n_src`` source frames.

    Use it as ``n_frames`` for :func:`choose_bucket` when resampling to ``target_fps``.
    """
    if n_src - start < 1:
        return 0
    r = _ratio(src_fps, target_fps)
    if r is None:
        return n_src - start
    last = n_src - 1 - start
    k = int(last / r) + 2
    while k > 0 and _nearest(k - 1, r) > last:
        k -= 1
    return k


def effective_fps(src_fps: float, target_fps: float | None) -> float:
    """The fps of the clip :func:`frame_indices` produces (what to store with it).

    ``src_fps`` at native rate, else ``target_fps``.
    """
    return float(src_fps) if _ratio(src_fps, target_fps) is None else float(target_fps)
