"""One table of every encoder family and one entry point, ``load_encoder(kind, family)``."""

from __future__ import annotations

from typing import Any

from . import text as _text
from . import vae as _vae

# (kind, family) -> one-line description
ENCODERS: dict[tuple[str, str], str] = {
    **{(f["kind"], name): f"{f['cls']}: {f['desc']}" for name, f in _vae.FAMILIES.items()},
    **{("text", name): f["desc"] for name, f in _text.FAMILIES.items()},
}


def families(kind: str | None = None) -> list[str]:
    """Family names, optionally for one kind ("image_vae", "video_vae", "vae", "text")."""
    return [f for (k, f) in ENCODERS if kind is None or k == kind or (kind == "vae" and k.endswith("_vae"))]


def load_encoder(kind: str, family: str, **kw: Any):
    """Load an encoder. ``kind`` is "image_vae", "video_vae", "vae" (either) or "text";
    keyword arguments go to :func:`load_vae` or :func:`load_text_encoder`."""
    if kind == "text":
        if ("text", family) not in ENCODERS:
            raise ValueError(f"unknown text encoder {family!r}; known: {families('text')}")
        return _text.load_text_encoder(family, **kw)
    if kind in ("vae", "image_vae", "video_vae"):
        if family not in _vae.FAMILIES:
            raise ValueError(f"unknown VAE family {family!r}; known: {families('vae')}")
        actual = _vae.FAMILIES[family]["kind"]
        if kind != "vae" and kind != actual:
            raise ValueError(f"{family!r} is a {actual}, not a {kind}")
        return _vae.load_vae(family, **kw)
    raise ValueError(f"unknown encoder kind {kind!r}; use 'image_vae', 'video_vae', 'vae' or 'text'")
