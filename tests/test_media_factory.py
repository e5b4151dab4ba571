import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import hashlib  # noqa: E402
import io  # noqa: E402
import json  # noqa: E402
import warnings  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from PIL import Image, ImageCms, ImageOps  # noqa: E402

from media_factory import (  # noqa: E402
    digits_data,
    digits_folder,
    nasty_folder,
    real_photos,
    write_table,
)

QUICKSTART = Path(__file__).resolve().parents[1] / "examples" / "quickstart"


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def _pixels(p: Path, dtype=None) -> np.ndarray:
    with Image.open(p) as im:
        return np.asarray(im, dtype=dtype)


def new_files(root: Path) -> list[Path]:
    return sorted(p.relative_to(root) for p in root.rglob("*") if p.is_file())


# --------------------------------------------------------------------------- photos


def test_real_photos_small_are_distinct_decodable_and_in_range(tmp_path):
    paths = real_photos(tmp_path, 40, seed=3, min_side=32, max_side=64)
    assert [p.name for p in paths] == [f"photo_{i:05d}.jpg" for i in range(40)]
    assert sorted(tmp_path.iterdir()) == sorted(paths)
    assert len({_sha(p) for p in paths}) == 40
    for p in paths:
        with Image.open(p) as im:
            im.load()
            assert im.format == "JPEG" and im.mode == "RGB"
            w, h = im.size
        assert 32 <= w <= 64 and 32 <= h <= 64
        assert 0.5 - 1e-9 <= w / h <= 2.0 + 1e-9
        # real content, not a flat fill
        assert _pixels(p).std() > 1.0


def test_real_photos_default_sizes_and_determinism(tmp_path):
    a = real_photos(tmp_path / "a", 8, seed=1)
    b = real_photos(tmp_path / "b", 8, seed=1)
    c = real_photos(tmp_path / "c", 8, seed=2)
    assert [_sha(p) for p in a] == [_sha(p) for p in b]
    assert {_sha(p) for p in a}.isdisjoint({_sha(p) for p in c})
    aspects = []
    for p in a:
        with Image.open(p) as im:
            w, h = im.size
        assert 200 <= w <= 640 and 200 <= h <= 640
        aspects.append(w / h)
    assert min(aspects) < 1 < max(aspects)  # both portrait and landscape occur


def test_real_photos_many_tiny_is_fast(tmp_path):
    paths = real_photos(tmp_path, 300, min_side=16, max_side=24, quality=80)
    assert len(paths) == 300
    assert len({_sha(p) for p in paths}) == 300


# --------------------------------------------------------------------------- digits


def test_digits_data_is_sklearn_digits():
    imgs, targets = digits_data()
    assert imgs.shape == (1797, 8, 8) and imgs.dtype == np.uint8
    assert imgs.min() == 0 and imgs.max() == 255
    assert np.bincount(targets).tolist() == [178, 182, 177, 183, 181, 182, 181, 179, 174, 180]
    assert targets[:10].tolist() == list(range(10))


def test_digits_folder_per_class(tmp_path):
    counts = digits_folder(tmp_path / "few", per_class=5)
    assert counts == {str(c): 5 for c in range(10)}
    files = sorted((tmp_path / "few").rglob("*.png"))
    assert len(files) == 50
    imgs, targets = digits_data()
    for f in files:
        idx = int(f.stem.split("_")[1])
        assert f.parent.name == str(targets[idx])
        with Image.open(f) as im:
            assert im.mode == "L" and im.size == (8, 8)
            arr = np.asarray(im)
        assert np.array_equal(arr, imgs[idx])
    # first ones in sklearn order: digit i of the first ten is class i
    assert (tmp_path / "few" / "3" / "digit_00003.png").exists()
    assert imgs.max() == 255 and imgs.min() == 0


def test_digits_folder_scale(tmp_path):
    digits_folder(tmp_path, per_class=1, scale=4)
    f = tmp_path / "7" / "digit_00007.png"
    with Image.open(f) as im:
        assert im.size == (32, 32) and im.mode == "L"
        arr = np.asarray(im)
    imgs, _ = digits_data()
    assert np.array_equal(arr[::4, ::4], imgs[7])
    assert np.array_equal(arr, np.kron(imgs[7], np.ones((4, 4), np.uint8)))


# --------------------------------------------------------------------------- nasty


@pytest.fixture(scope="module")
def nasty(tmp_path_factory):
    d = tmp_path_factory.mktemp("nasty")
    return d, nasty_folder(d)


REQUIRED_NASTY = {
    "truncated.jpg", "zero_byte.jpg", "cmyk.jpg", "sixteen_bit.png", "palette_alpha.png",
    "la_alpha.png", "rgba.png", "exif_rotated.jpg", "not_an_image.jpg",
    "caption_latin1.jpg", "caption_latin1.txt", "good_caption.jpg", "good_caption.txt",
    "name.with.many.dots.jpg", "name with spaces.jpg", "ünïcødé 名前.jpg",
    "duplicate_a.jpg", "duplicate_b.jpg", "tiny.png", "adobe_rgb.jpg", "bomb.png",
    "grayscale.jpg", "gif_frame.gif", "webp_photo.webp", "bmp_photo.bmp", "tiff_photo.tif",
}  # fmt: skip


def test_nasty_manifest_matches_disk_and_is_small(nasty):
    d, manifest = nasty
    on_disk = {p.name for p in d.iterdir()}
    assert set(manifest) == on_disk
    assert REQUIRED_NASTY <= on_disk
    assert all(isinstance(v, str) and v for v in manifest.values())
    assert sum(p.stat().st_size for p in d.iterdir()) < 2_000_000
    assert (d / "bomb.png").stat().st_size < 100_000


def test_nasty_broken_files(nasty):
    d, _ = nasty
    assert (d / "zero_byte.jpg").stat().st_size == 0
    with Image.open(d / "truncated.jpg") as im:  # header is intact ...
        assert im.format == "JPEG"
        with pytest.raises(OSError):
            im.load()  # ... but the pixel data is not
    for name in ("not_an_image.jpg", "zero_byte.jpg"):
        with pytest.raises(Image.UnidentifiedImageError):
            Image.open(d / name)
    (d / "not_an_image.jpg").read_bytes().decode("utf-8")
    with Image.open(d / "png_disguised.jpg") as im:
        assert im.format == "PNG"


def test_nasty_modes(nasty):
    d, _ = nasty
    expect = {
        "cmyk.jpg": ("JPEG", "CMYK"),
        "sixteen_bit.png": ("PNG", "I;16"),
        "palette_alpha.png": ("PNG", "P"),
        "la_alpha.png": ("PNG", "LA"),
        "rgba.png": ("PNG", "RGBA"),
        "grayscale.jpg": ("JPEG", "L"),
        "gif_frame.gif": ("GIF", "P"),
        "webp_photo.webp": ("WEBP", "RGB"),
        "bmp_photo.bmp": ("BMP", "RGB"),
        "tiff_photo.tif": ("TIFF", "RGB"),
        "tiny.png": ("PNG", "RGB"),
    }
    for name, (fmt, mode) in expect.items():
        with Image.open(d / name) as im:
            im.load()
            assert (im.format, im.mode) == (fmt, mode), name
    with Image.open(d / "sixteen_bit.png") as im:
        arr = np.asarray(im)
    assert arr.dtype == np.uint16 and arr.max() > 255 * 200  # really uses the 16-bit range
    with Image.open(d / "palette_alpha.png") as im:
        assert im.info.get("transparency") == 255
        idx = np.asarray(im)
    assert (idx == 255).any() and (idx != 255).any()
    with Image.open(d / "rgba.png") as im:
        alpha = np.asarray(im)[..., 3]
    assert alpha.min() == 0 and alpha.max() == 255
    with Image.open(d / "la_alpha.png") as im:
        la = np.asarray(im)[..., 1]
    assert la.min() == 0 and la.max() == 255
    with Image.open(d / "gif_frame.gif") as im:
        assert im.n_frames > 1
    with Image.open(d / "tiny.png") as im:
        assert im.size == (12, 9)


def test_nasty_exif_rotation(nasty):
    d, _ = nasty
    with Image.open(d / "exif_rotated.jpg") as im:
        assert im.getexif().get(0x0112) == 6
        w, h = im.size
        assert w > h  # stored landscape
        up = ImageOps.exif_transpose(im)
    assert up.size == (h, w) and up.height > up.width  # displayed portrait
    assert 0x0112 not in up.getexif()


def test_nasty_icc_profiles(nasty):
    d, _ = nasty
    with Image.open(d / "adobe_rgb.jpg") as im:
        assert im.mode == "RGB"
        prof = ImageCms.ImageCmsProfile(io.BytesIO(im.info["icc_profile"]))
    desc = ImageCms.getProfileDescription(prof)
    assert "srgb" not in desc.lower() and "adobe rgb" in desc.lower()
    with Image.open(d / "srgb_icc.jpg") as im:
        prof = ImageCms.ImageCmsProfile(io.BytesIO(im.info["icc_profile"]))
    assert "srgb" in ImageCms.getProfileDescription(prof).lower()


def test_nasty_bomb_declares_huge_size(nasty):
    d, _ = nasty
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        try:
            im = Image.open(d / "bomb.png")
        except Image.DecompressionBombError:  # stricter MAX_IMAGE_PIXELS set elsewhere
            return
        with im:  # never .load(): that would allocate ~144 MB
            w, h = im.size
            assert im.mode == "1"
    assert w * h > 100_000_000


def test_nasty_captions_and_duplicates(nasty):
    d, _ = nasty
    raw = (d / "caption_latin1.txt").read_bytes()
    with pytest.raises(UnicodeDecodeError):
        raw.decode("utf-8")
    assert raw.decode("latin-1") == "café crème"
    assert (d / "good_caption.txt").read_text(encoding="utf-8") == "naïve 🌸 café"
    assert (d / "duplicate_a.jpg").read_bytes() == (d / "duplicate_b.jpg").read_bytes()
    # apart from the deliberate duplicates, all images are distinct
    images = [p for p in d.iterdir() if p.suffix.lower() != ".txt" and p.stat().st_size > 0]
    shas = [_sha(p) for p in images]
    assert len(shas) - len(set(shas)) == 1
    for name in ("caption_latin1.jpg", "good_caption.jpg", "name.with.many.dots.jpg",
                 "name with spaces.jpg", "ünïcødé 名前.jpg", "UPPER_EXT.JPG"):  # fmt: skip
        with Image.open(d / name) as im:
            im.load()
            assert im.mode == "RGB"


# --------------------------------------------------------------------------- tables


@pytest.mark.parametrize("fmt", ["csv", "json", "jsonl", "parquet"])
def test_write_table_roundtrip(tmp_path, fmt):
    rows = [
        {"file_name": "a.jpg", "caption": "naïve 🌸 café", "label": 1},
        {"file_name": "b c.jpg", "caption": 'comma, "quote"', "label": 2},
    ]
    p = write_table(tmp_path, rows, fmt)
    assert p == tmp_path / f"metadata.{fmt}"
    if fmt == "csv":
        import csv

        with p.open(encoding="utf-8", newline="") as f:
            got = list(csv.DictReader(f))
        assert [r["caption"] for r in got] == [r["caption"] for r in rows]
        assert [int(r["label"]) for r in got] == [1, 2]
    elif fmt == "json":
        assert json.loads(p.read_text(encoding="utf-8")) == rows
    elif fmt == "jsonl":
        assert [json.loads(x) for x in p.read_text(encoding="utf-8").splitlines()] == rows
    else:
        import pyarrow.parquet as pq

        assert pq.read_table(p).to_pylist() == rows


def test_write_table_rejects_unknown_format(tmp_path):
    with pytest.raises(ValueError):
        write_table(tmp_path, [{"a": 1}], "xlsx")


# --------------------------------------------------------------------------- bundle


def test_quickstart_bundle_matches_factory_and_is_small():
    if not (QUICKSTART / "digits").is_dir():
        pytest.skip("quickstart bundle not present")
    files = [p for p in QUICKSTART.rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    assert sum(p.stat().st_size for p in files) < 600 * 1024
    photos = sorted((QUICKSTART / "photos").glob("*.jpg"))
    assert len(photos) == 6
    for p in photos:
        with Image.open(p) as im:
            im.load()
            assert im.mode == "RGB" and max(im.size) <= 512
        text = p.with_suffix(".txt").read_text(encoding="utf-8").strip()
        assert text.endswith(".") and len(text.split()) >= 6
    # the bundled digits are exactly what the factory produces
    imgs, targets = digits_data()
    bundled = sorted((QUICKSTART / "digits").rglob("*.png"))
    assert len(bundled) == 200
    for f in bundled:
        idx = int(f.stem.split("_")[1])
        assert f.parent.name == str(targets[idx])
        assert np.array_equal(_pixels(f), imgs[idx])
    for c in range(10):
        first20 = [i for i in range(len(targets)) if targets[i] == c][:20]
        assert sorted(int(f.stem[6:]) for f in (QUICKSTART / "digits" / str(c)).glob("*.png")) == first20


def test_quickstart_make_example_reproduces_bundle(tmp_path):
    script = QUICKSTART / "make_example.py"
    if not script.is_file() or not (QUICKSTART / "photos").is_dir():
        pytest.skip("quickstart bundle not present")
    import importlib.util

    spec = importlib.util.spec_from_file_location("_quickstart_make_example", script)
    mod = importlib.util.module_from_spec(spec)
    dont_write, sys.dont_write_bytecode = sys.dont_write_bytecode, True  # keep the bundle clean
    try:
        spec.loader.exec_module(mod)
    finally:
        sys.dont_write_bytecode = dont_write
    mod.main(["--out", str(tmp_path)])
    for sub in ("photos", "digits"):
        new = sorted(p.relative_to(tmp_path) for p in (tmp_path / sub).rglob("*") if p.is_file())
        old = sorted(p.relative_to(QUICKSTART) for p in (QUICKSTART / sub).rglob("*") if p.is_file())
        assert new == old
    for rel in new_files(tmp_path):
        a, b = (tmp_path / rel), (QUICKSTART / rel)
        if rel.suffix == ".jpg":  # tolerate a different libjpeg build
            x = _pixels(a, np.int16)
            y = _pixels(b, np.int16)
            assert x.shape == y.shape and np.abs(x - y).mean() < 1.0, rel
        else:
            assert a.read_bytes() == b.read_bytes(), rel
