"""Deterministic generators of *real* test media for shardsmith's tests.

Everything here is derived from photographs and scans that ship offline inside
installed packages (scikit-image's sample data, matplotlib's sample data and
scikit-learn's handwritten digits), so no network access is ever needed.
All generators are seeded / fully deterministic: the same arguments always
produce byte-identical files (for a given Pillow / libjpeg build).

This is a plain module (no pytest fixtures) so that tests, benchmarks and
example scripts can all import it.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import struct
import unicodedata
import zlib
from pathlib import Path

import numpy as np
from PIL import Image, ImageCms

__all__ = [
    "SOURCE_NAMES",
    "source_photo",
    "real_photos",
    "digits_folder",
    "digits_data",
    "nasty_folder",
    "write_table",
]

#: Names of the real source photos, in the fixed order used by the generators.
SOURCE_NAMES: tuple[str, ...] = (
    "astronaut",
    "chelsea",
    "coffee",
    "rocket",
    "hubble_deep_field",
    "retina",
    "camera",
    "grace_hopper",
)

# name -> decoded RGB source photo (full resolution, sRGB).
_SOURCES: dict[str, Image.Image] = {}
# name -> list of (factor, image) reduced copies, factor 1 first.
_PYRAMIDS: dict[str, list[tuple[int, Image.Image]]] = {}
# cached (images uint8 0..16 as float, targets) of sklearn's digits.
_DIGITS: tuple[np.ndarray, np.ndarray] | None = None

_SRGB_PROFILE = None


def _srgb_profile():
    global _SRGB_PROFILE
    if _SRGB_PROFILE is None:
        _SRGB_PROFILE = ImageCms.ImageCmsProfile(ImageCms.createProfile("sRGB"))
    return _SRGB_PROFILE


def _skimage_dir() -> Path:
    import skimage.data

    return Path(getattr(skimage.data, "data_dir", Path(skimage.data.__file__).parent))


def _skimage_file(name: str) -> Path | None:
    for ext in (".png", ".jpg"):
        p = _skimage_dir() / f"{name}{ext}"
        if p.is_file():
            return p
    return None


def _icc_profile_of(name: str) -> bytes | None:
    """The ICC profile embedded in the shipped file of source ``name``, if any."""
    if name == "grace_hopper":
        path = _grace_hopper_path()
    else:
        path = _skimage_file(name)
    if path is None:
        return None
    with Image.open(path) as im:
        return im.info.get("icc_profile")


def _grace_hopper_path() -> Path:
    from matplotlib import cbook

    return Path(cbook.get_sample_data("grace_hopper.jpg", asfileobj=False))


def _load_source(name: str) -> Image.Image:
    if name == "grace_hopper":
        with Image.open(_grace_hopper_path()) as im:
            img = im.convert("RGB")
    else:
        import skimage.data

        arr = np.asarray(getattr(skimage.data, name)())
        if arr.ndim == 2:  # camera is grayscale
            arr = np.stack([arr] * 3, axis=-1)
        img = Image.fromarray(np.ascontiguousarray(arr[..., :3]).astype(np.uint8))
    # rocket.jpg carries an Adobe RGB (1998) profile: bring it to sRGB so that
    # derived files (which carry no profile) show the right colours.
    icc = _icc_profile_of(name)
    if icc:
        prof = ImageCms.ImageCmsProfile(io.BytesIO(icc))
        if "srgb" not in ImageCms.getProfileDescription(prof).lower():
            img = ImageCms.profileToProfile(img, prof, _srgb_profile(), outputMode="RGB")
    return img


def source_photo(name: str) -> Image.Image:
    """Return (a copy of) the cached, decoded RGB sRGB source photo ``name``.

    Writes nothing. ``name`` is one of :data:`SOURCE_NAMES`.
    """
    if name not in SOURCE_NAMES:
        raise KeyError(f"unknown source photo {name!r}; choose from {SOURCE_NAMES}")
    if name not in _SOURCES:
        _SOURCES[name] = _load_source(name)
    return _SOURCES[name].copy()


def _pyramid(name: str) -> list[tuple[int, Image.Image]]:
    if name not in _PYRAMIDS:
        if name not in _SOURCES:
            _SOURCES[name] = _load_source(name)
        levels = [(1, _SOURCES[name])]
        while min(levels[-1][1].size) >= 64:
            f, im = levels[-1]
            levels.append((f * 2, im.reduce(2)))
        _PYRAMIDS[name] = levels
    return _PYRAMIDS[name]


def _crop_resize(name: str, box: tuple[float, float, float, float], size: tuple[int, int]) -> Image.Image:
    """Crop ``box`` (full-resolution coordinates) of source ``name`` and resize to ``size``.

    Uses the smallest cached pyramid level that still has >= 2x oversampling,
    which keeps generating tens of thousands of thumbnails fast.
    """
    x0, y0, x1, y1 = box
    level_factor, level = 1, _pyramid(name)[0][1]
    for f, im in _pyramid(name):
        if (x1 - x0) / f >= 2 * size[0] and (y1 - y0) / f >= 2 * size[1]:
            level_factor, level = f, im
        else:
            break
    lb = (x0 / level_factor, y0 / level_factor, x1 / level_factor, y1 / level_factor)
    lb = (lb[0], lb[1], min(lb[2], level.width), min(lb[3], level.height))
    return level.resize(size, Image.Resampling.BICUBIC, box=lb)


def _random_view(
    rng: np.random.Generator, name: str, min_side: int, max_side: int
) -> Image.Image:
    """A seeded random crop (aspect 0.5..2.0) + rescale + optional h-flip of ``name``."""
    src_w, src_h = _pyramid(name)[0][1].size
    # Aspect ratio (w/h), log-uniform, restricted so both sides fit in [min_side, max_side].
    lim = min(2.0, max_side / min_side)
    aspect = float(np.exp(rng.uniform(-np.log(lim), np.log(lim))))
    stretch = max(aspect, 1.0 / aspect)
    lo = int(np.ceil(min_side * stretch))
    long_side = int(rng.integers(min(lo, max_side), max_side + 1))
    short_side = int(np.clip(round(long_side / stretch), min_side, max_side))
    w, h = (long_side, short_side) if aspect >= 1 else (short_side, long_side)
    # Largest crop with that aspect that fits the source, then scale it down randomly.
    cw = min(src_w, src_h * w / h)
    ch = cw * h / w
    frac = float(rng.uniform(0.3, 1.0))
    cw, ch = cw * frac, ch * frac
    x0 = float(rng.uniform(0, src_w - cw))
    y0 = float(rng.uniform(0, src_h - ch))
    img = _crop_resize(name, (x0, y0, x0 + cw, y0 + ch), (w, h))
    if rng.random() < 0.5:
        img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return img


def _jpeg_bytes(img: Image.Image, quality: int = 92, **kw) -> bytes:
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=quality, **kw)
    return buf.getvalue()


def real_photos(
    dest: Path,
    n: int,
    *,
    seed: int = 0,
    min_side: int = 200,
    max_side: int = 640,
    quality: int = 92,
) -> list[Path]:
    """Write ``n`` distinct RGB JPEGs ``dest/photo_00000.jpg`` ... and return their paths.

    Each photo is a seeded random crop (aspect ratio 0.5..2.0) of one of the real
    photos in :data:`SOURCE_NAMES`, rescaled so that both sides lie in
    ``[min_side, max_side]``, and horizontally flipped half the time. Files are
    guaranteed pairwise different (sha256 of bytes); same arguments -> same bytes.
    """
    if n < 0:
        raise ValueError("n must be >= 0")
    if not (1 <= min_side <= max_side):
        raise ValueError("need 1 <= min_side <= max_side")
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    order = [SOURCE_NAMES[i] for i in rng.permutation(len(SOURCE_NAMES))]
    seen: set[bytes] = set()
    paths: list[Path] = []
    width = max(5, len(str(max(n - 1, 0))))
    for i in range(n):
        name = order[i % len(order)]
        for _attempt in range(100):
            data = _jpeg_bytes(_random_view(rng, name, min_side, max_side), quality)
            digest = hashlib.sha256(data).digest()
            if digest not in seen:
                break
        else:  # pragma: no cover - would need absurdly tiny sizes
            raise RuntimeError("could not generate a distinct photo; widen min_side..max_side")
        seen.add(digest)
        p = dest / f"photo_{i:0{width}d}.jpg"
        p.write_bytes(data)
        paths.append(p)
    return paths


def digits_data() -> tuple[np.ndarray, np.ndarray]:
    """Return (images uint8 (1797, 8, 8) scaled 0..255, targets int) of sklearn's digits.

    Writes nothing. Pixel values 0..16 are mapped to 0..255 by ``round(v * 255 / 16)``.
    """
    global _DIGITS
    if _DIGITS is None:
        images, target = _load_digits_raw()
        imgs = np.rint(images * (255.0 / 16.0)).clip(0, 255).astype(np.uint8)
        _DIGITS = (imgs, np.asarray(target, dtype=np.int64))
    return _DIGITS[0].copy(), _DIGITS[1].copy()


def _load_digits_raw() -> tuple[np.ndarray, np.ndarray]:
    """sklearn's digits as (float images 0..16 (1797, 8, 8), int targets).

    Reads ``sklearn/datasets/data/digits.csv.gz`` exactly as ``load_digits`` does,
    but without importing scikit-learn (which costs ~2 s); falls back to
    ``sklearn.datasets.load_digits()`` if the file is not where expected.
    """
    import importlib.util

    spec = importlib.util.find_spec("sklearn")
    if spec is not None and spec.origin:
        csv_gz = Path(spec.origin).parent / "datasets" / "data" / "digits.csv.gz"
        if csv_gz.is_file():
            data = np.loadtxt(csv_gz, delimiter=",")
            return data[:, :-1].reshape(-1, 8, 8), data[:, -1].astype(int)
    from sklearn.datasets import load_digits

    d = load_digits()
    return d.images, d.target


def digits_folder(dest: Path, per_class: int | None = None, *, scale: int = 1) -> dict[str, int]:
    """Write sklearn's real handwritten digits as grayscale PNGs ``dest/<class>/digit_NNNNN.png``.

    ``NNNNN`` is the index within ``sklearn.datasets.load_digits`` (1797 images,
    8x8, optionally nearest-neighbour upscaled by ``scale``); class folders are
    ``"0"`` ... ``"9"``. ``per_class`` keeps only the first images of each class
    in sklearn order. Returns ``{class_name: count}``.
    """
    if scale < 1:
        raise ValueError("scale must be >= 1")
    dest = Path(dest)
    imgs, targets = digits_data()
    counts: dict[str, int] = {str(c): 0 for c in range(10)}
    for c in range(10):
        (dest / str(c)).mkdir(parents=True, exist_ok=True)
    for idx, (arr, t) in enumerate(zip(imgs, targets)):
        cls = str(int(t))
        if per_class is not None and counts[cls] >= per_class:
            continue
        if scale != 1:
            arr = np.kron(arr, np.ones((scale, scale), dtype=np.uint8))
        Image.fromarray(arr).save(dest / cls / f"digit_{idx:05d}.png")
        counts[cls] += 1
    return counts


# ---------------------------------------------------------------------------
# nasty inputs
# ---------------------------------------------------------------------------


def _view(name: str, box: tuple[int, int, int, int], long_side: int = 256) -> Image.Image:
    """Deterministic crop ``box`` of source ``name``, thumbnailed to ``long_side``."""
    img = source_photo(name).crop(box)
    img.thumbnail((long_side, long_side), Image.Resampling.LANCZOS)
    return img


def _png_chunk(tag: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)


def _bomb_png(width: int, height: int) -> bytes:
    """A valid 1-bit grayscale all-black PNG of the given (huge) size, built without
    ever materialising the pixels (tiny on disk, ~18 KB for 12000x12000)."""
    ihdr = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)  # bit depth 1, grayscale
    row = b"\x00" + b"\x00" * ((width + 7) // 8)  # filter byte + packed black pixels
    comp = zlib.compressobj(9)
    chunks = []
    rows_per_block = 1000
    block = row * rows_per_block
    left = height
    while left:
        k = min(rows_per_block, left)
        chunks.append(comp.compress(block if k == rows_per_block else row * k))
        left -= k
    chunks.append(comp.flush())
    return (
        b"\x89PNG\r\n\x1a\n"
        + _png_chunk(b"IHDR", ihdr)
        + _png_chunk(b"IDAT", b"".join(chunks))
        + _png_chunk(b"IEND", b"")
    )


def nasty_folder(dest: Path) -> dict[str, str]:
    """Write a folder of awkward / broken inputs derived from real photos.

    Returns ``{relative file name: short description}`` for *every* file written
    (sidecar ``<stem>.txt`` captions included). Total size is well under 2 MB;
    ``bomb.png`` declares 12000x12000 pixels but is ~18 KB on disk.
    """
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    out: dict[str, str] = {}

    def put(name: str, data: bytes, desc: str) -> None:
        (dest / name).write_bytes(data)
        out[name] = desc

    def put_img(name: str, img: Image.Image, desc: str, fmt: str, **kw) -> None:
        buf = io.BytesIO()
        img.save(buf, fmt, **kw)
        put(name, buf.getvalue(), desc)

    def caption(stem: str, text: str, desc: str = "UTF-8 sidecar caption") -> None:
        put(f"{stem}.txt", text.encode("utf-8"), desc)

    # --- broken files ---------------------------------------------------
    full = _jpeg_bytes(_view("astronaut", (0, 0, 512, 512)), 90)
    put("truncated.jpg", full[: int(len(full) * 0.6)], "real JPEG cut to 60% of its bytes; Image.load() fails")
    put("zero_byte.jpg", b"", "empty file with a .jpg name")
    put(
        "not_an_image.jpg",
        "This is a plain UTF-8 text file, not a JPEG.\nÇa ne décode pas.\n".encode("utf-8"),
        "UTF-8 text file named .jpg",
    )
    png_buf = io.BytesIO()
    _view("coffee", (100, 50, 500, 350), 160).save(png_buf, "PNG")
    put("png_disguised.jpg", png_buf.getvalue(), "valid PNG (RGB) saved under a .jpg name")
    put("bomb.png", _bomb_png(12000, 12000), "PNG declaring 12000x12000 mode '1' (144M pixels), all black, ~18 KB on disk")

    # --- unusual modes / formats ----------------------------------------
    put_img("cmyk.jpg", _view("coffee", (0, 0, 600, 400)).convert("CMYK"), "CMYK JPEG (mode CMYK, Adobe APP14 marker)", "JPEG", quality=88)
    caption("cmyk", "A cup of espresso on a red saucer, stored as a CMYK JPEG.")

    gray = np.asarray(_view("camera", (64, 0, 448, 384), 192).convert("L"), dtype=np.uint16)
    arr16 = (gray * 257).astype("<u2")  # 0..255 -> 0..65535
    put_img("sixteen_bit.png", Image.fromarray(arr16), "16-bit grayscale PNG (mode I;16), real photo scaled to 0..65535", "PNG")

    q = _view("chelsea", (60, 0, 400, 300), 200).quantize(colors=255)
    idx = np.asarray(q).copy()
    hh, ww = idx.shape
    yy, xx = np.mgrid[0:hh, 0:ww]
    outside = ((xx - ww / 2) / (ww / 2)) ** 2 + ((yy - hh / 2) / (hh / 2)) ** 2 > 1.0
    idx[outside] = 255  # transparent corners around an elliptical vignette
    pal = list(q.getpalette() or [])[: 255 * 3]
    pal += [0] * (768 - len(pal))
    pimg = Image.fromarray(idx)
    pimg.putpalette(pal)  # turns the L image into mode P
    put_img("palette_alpha.png", pimg, "palette (mode P) PNG, index 255 transparent (tRNS) outside an ellipse", "PNG", transparency=255)

    lum = _view("grace_hopper", (0, 0, 512, 600), 200).convert("L")
    ay, ax = np.mgrid[0 : lum.height, 0 : lum.width]
    r = np.hypot((ax - lum.width / 2) / (lum.width / 2), (ay - lum.height / 2) / (lum.height / 2))
    alpha_radial = Image.fromarray((255 * np.clip(1.3 - r, 0, 1)).astype(np.uint8))
    put_img("la_alpha.png", Image.merge("LA", (lum, alpha_radial)), "grayscale + alpha PNG (mode LA), radial alpha", "PNG")

    rgb = _view("rocket", (100, 0, 540, 427), 220)
    grad = np.tile(np.linspace(0, 255, rgb.width).astype(np.uint8), (rgb.height, 1))
    rgba = rgb.copy()
    rgba.putalpha(Image.fromarray(grad))
    put_img("rgba.png", rgba, "RGBA PNG with a left-to-right alpha gradient 0..255", "PNG")
    caption("rgba", "A Falcon 9 rocket on its launch pad at dusk, fading to transparent on the left.")

    put_img("grayscale.jpg", _view("camera", (0, 0, 512, 512), 200).convert("L"), "grayscale JPEG (mode L)", "JPEG", quality=88)
    caption("grayscale", "A black-and-white photo of a person operating a camera on a tripod.")

    put_img("tiny.png", source_photo("astronaut").crop((180, 60, 192, 69)), "12x9 RGB crop of a real photo", "PNG")

    put("gif_frame.gif", (_skimage_dir() / "no_time_for_that_tiny.gif").read_bytes(), "animated GIF (24 frames, 25x14, mode P) copied from skimage data")

    put_img("webp_photo.webp", _view("coffee", (150, 0, 600, 400), 240), "lossy WebP photo", "WEBP", quality=80)
    caption("webp_photo", "A cup of espresso with a spoon on a red saucer, saved as WebP.")
    put_img("bmp_photo.bmp", _view("chelsea", (0, 0, 451, 300), 160), "uncompressed 24-bit BMP photo", "BMP")
    put_img("tiff_photo.tif", _view("hubble_deep_field", (200, 200, 600, 500), 200), "LZW-compressed RGB TIFF photo", "TIFF", compression="tiff_lzw")

    # --- orientation / colour management ----------------------------------
    upright = _view("grace_hopper", (56, 0, 456, 600), 240)  # portrait 160x240
    stored = upright.transpose(Image.Transpose.ROTATE_90)  # landscape 240x160
    exif = Image.Exif()
    exif[0x0112] = 6  # Orientation: rotate 90 CW to display
    put_img(
        "exif_rotated.jpg",
        stored,
        "landscape-stored JPEG with EXIF Orientation=6; exif_transpose gives the upright portrait",
        "JPEG",
        quality=90,
        exif=exif.tobytes(),
    )
    caption("exif_rotated", "Portrait of Grace Hopper in a navy uniform, stored sideways with an EXIF rotation.")

    rocket_file = _skimage_file("rocket")
    with Image.open(rocket_file) as rk:
        adobe_icc = rk.info.get("icc_profile")
        rk_crop = rk.convert("RGB").crop((120, 0, 520, 427))
    rk_crop.thumbnail((240, 240), Image.Resampling.LANCZOS)
    put_img(
        "adobe_rgb.jpg",
        rk_crop,
        "RGB JPEG whose pixels are Adobe RGB (1998), with that (non-sRGB) ICC profile embedded",
        "JPEG",
        quality=88,
        icc_profile=adobe_icc,
    )
    put_img(
        "srgb_icc.jpg",
        _view("astronaut", (256, 256, 512, 512), 160),
        "RGB JPEG carrying an explicit sRGB ICC profile built with PIL.ImageCms",
        "JPEG",
        quality=88,
        icc_profile=_srgb_profile().tobytes(),
    )

    # --- captions / encodings ----------------------------------------------
    put("caption_latin1.jpg", _jpeg_bytes(_view("coffee", (0, 0, 300, 300), 200), 88), "valid photo whose caption is latin-1")
    put("caption_latin1.txt", "café crème".encode("latin-1"), "latin-1 encoded caption 'café crème' (invalid UTF-8)")
    put("good_caption.jpg", _jpeg_bytes(_view("chelsea", (150, 0, 451, 300), 200), 88), "valid photo with a unicode caption")
    caption("good_caption", "naïve 🌸 café", "UTF-8 caption with non-ASCII and an emoji: 'naïve 🌸 café'")

    # --- awkward file names ------------------------------------------------
    put("name.with.many.dots.jpg", _jpeg_bytes(_view("rocket", (0, 0, 427, 427), 180), 88), "file name with several dots")
    caption("name.with.many.dots", "A rocket on a launch pad; the file name has many dots.")
    put("name with spaces.jpg", _jpeg_bytes(_view("hubble_deep_field", (0, 0, 500, 400), 200), 88), "file name with spaces")
    uni = unicodedata.normalize("NFC", "ünïcødé 名前.jpg")
    put(uni, _jpeg_bytes(_view("astronaut", (0, 200, 256, 512), 180), 88), "non-ASCII (NFC) file name with CJK characters")
    put("UPPER_EXT.JPG", _jpeg_bytes(_view("retina", (300, 300, 1100, 1100), 180), 88), "JPEG with an upper-case .JPG extension")

    dup = _jpeg_bytes(_view("chelsea", (200, 50, 451, 300), 180), 88)
    put("duplicate_a.jpg", dup, "photo, byte-identical to duplicate_b.jpg")
    put("duplicate_b.jpg", dup, "photo, byte-identical to duplicate_a.jpg")
    return out


# ---------------------------------------------------------------------------
# metadata tables
# ---------------------------------------------------------------------------


def write_table(dest: Path, rows: list[dict], fmt: str) -> Path:
    """Write ``rows`` to ``dest/metadata.<fmt>`` and return its path.

    ``fmt`` is ``csv`` (header = union of keys in first-seen order, UTF-8),
    ``json`` (a single JSON list), ``jsonl`` (one object per line) or
    ``parquet`` (via pyarrow).
    """
    fmt = fmt.lower().lstrip(".")
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    path = dest / f"metadata.{fmt}"
    if fmt == "csv":
        fields: list[str] = []
        for r in rows:
            for k in r:
                if k not in fields:
                    fields.append(k)
        with path.open("w", encoding="utf-8", newline="") as f:
            w = csv.DictWriter(f, fieldnames=fields)
            w.writeheader()
            w.writerows(rows)
    elif fmt == "json":
        path.write_text(json.dumps(rows, ensure_ascii=False, indent=1), encoding="utf-8")
    elif fmt == "jsonl":
        path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    elif fmt == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), path)
    else:
        raise ValueError(f"unsupported table format {fmt!r} (csv, json, jsonl, parquet)")
    return path
