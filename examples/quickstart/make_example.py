#!/usr/bin/env python
"""Regenerate the quickstart example data (``photos/`` and ``digits/``) deterministically.

Everything is derived from real photos and scans that ship *inside* installed
packages, so no network access is needed:

* scikit-image sample data: astronaut, chelsea, coffee, rocket, hubble_deep_field
* matplotlib sample data: grace_hopper.jpg
* scikit-learn: ``load_digits()`` (UCI optical recognition of handwritten digits)

Usage::

    python make_example.py            # rewrite photos/ and digits/ next to this file
    python make_example.py --out DIR  # write them under DIR instead

Re-running it produces the same files (byte-identical for a given Pillow /
libjpeg / zlib build). The pixel logic mirrors ``tests/media_factory.py``
(sRGB conversion of embedded ICC profiles, digits scaled by
``round(v * 255 / 16)``); it is kept self-contained so the example does not
depend on the test suite. See LICENSES.md for provenance and licences.
"""

from __future__ import annotations

import argparse
import io
import shutil
from pathlib import Path

import numpy as np
from PIL import Image, ImageCms

HERE = Path(__file__).resolve().parent

MAX_SIDE = 512
JPEG_QUALITY = 90
DIGITS_PER_CLASS = 20

# name -> (crop box in source pixels or None for the whole photo, caption)
PHOTOS: dict[str, tuple[tuple[int, int, int, int] | None, str]] = {
    "astronaut": (
        None,
        "A smiling astronaut in an orange spacesuit sits beside her helmet, "
        "with an American flag and a model of the space shuttle behind her.",
    ),
    "chelsea": (
        None,
        "A close-up of a brown tabby cat with green eyes and a pink nose.",
    ),
    "coffee": (
        None,
        "A cup of espresso with a metal spoon on a red saucer, on a wooden table.",
    ),
    "rocket": (
        None,
        "A Falcon 9 rocket stands on its launch pad at dusk between tall lattice "
        "towers, lit by bright floodlights.",
    ),
    "grace_hopper": (
        None,
        "A formal portrait of Grace Hopper in a dark US Navy uniform and cap, "
        "with an American flag behind her.",
    ),
    "hubble_deep_field": (
        (244, 218, 756, 602),
        "Hundreds of small, faint galaxies of different colours scattered across "
        "a black sky, seen in the Hubble eXtreme Deep Field.",
    ),
}


def _srgb() -> ImageCms.ImageCmsProfile:
    return ImageCms.ImageCmsProfile(ImageCms.createProfile("sRGB"))


def load_source(name: str) -> Image.Image:
    """Decode a shipped source photo as RGB, converted to sRGB if it embeds another profile."""
    if name == "grace_hopper":
        from matplotlib import cbook

        path = Path(cbook.get_sample_data("grace_hopper.jpg", asfileobj=False))
    else:
        import skimage.data

        data_dir = Path(getattr(skimage.data, "data_dir", Path(skimage.data.__file__).parent))
        path = next(p for p in (data_dir / f"{name}.png", data_dir / f"{name}.jpg") if p.is_file())
    with Image.open(path) as im:
        icc = im.info.get("icc_profile")
        img = im.convert("RGB")
    if icc:
        prof = ImageCms.ImageCmsProfile(io.BytesIO(icc))
        if "srgb" not in ImageCms.getProfileDescription(prof).lower():
            # rocket.jpg is Adobe RGB (1998): convert so the profile-less output is correct.
            img = ImageCms.profileToProfile(img, prof, _srgb(), outputMode="RGB")
    return img


def make_photos(out: Path) -> list[Path]:
    """Write ``out/<name>.jpg`` (longer side <= 512, quality 90) and ``out/<name>.txt`` captions."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, (box, text) in PHOTOS.items():
        img = load_source(name)
        if box is not None:
            img = img.crop(box)
        if max(img.size) > MAX_SIDE:
            s = MAX_SIDE / max(img.size)
            img = img.resize(
                (max(1, round(img.width * s)), max(1, round(img.height * s))),
                Image.Resampling.LANCZOS,
            )
        p = out / f"{name}.jpg"
        img.save(p, "JPEG", quality=JPEG_QUALITY, optimize=True)
        (out / f"{name}.txt").write_text(text + "\n", encoding="utf-8")
        written.append(p)
    return written


def make_digits(out: Path, per_class: int = DIGITS_PER_CLASS) -> dict[str, int]:
    """Write the first ``per_class`` sklearn digits of each class as 8x8 grayscale PNGs
    ``out/<class>/digit_<sklearn index>.png``; return ``{class: count}``."""
    from sklearn.datasets import load_digits

    d = load_digits()
    imgs = np.rint(d.images * (255.0 / 16.0)).clip(0, 255).astype(np.uint8)
    counts = {str(c): 0 for c in range(10)}
    for c in counts:
        (out / c).mkdir(parents=True, exist_ok=True)
    for idx, (arr, t) in enumerate(zip(imgs, d.target)):
        cls = str(int(t))
        if counts[cls] >= per_class:
            continue
        Image.fromarray(arr).save(out / cls / f"digit_{idx:05d}.png")
        counts[cls] += 1
    return counts


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=HERE, help="output folder (default: next to this script)")
    args = ap.parse_args(argv)
    out: Path = args.out
    for sub in ("photos", "digits"):
        if (out / sub).exists():
            shutil.rmtree(out / sub)
    photos = make_photos(out / "photos")
    counts = make_digits(out / "digits")
    total = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    print(f"wrote {len(photos)} photos and {sum(counts.values())} digits under {out} ({total / 1024:.0f} KiB in total)")


if __name__ == "__main__":
    main()
