"""Issue 16: img2dataset's fixed-size `wds` images. `image.size` with `resize_mode` center_crop |
border | keep_ratio (img2dataset's `image_size` / `resize_mode`, geometry as its `resizer.py`:
shorter side to the size then a centred crop; longer side to the size then padded; shorter side to
the size) and `max_aspect` (its `max_aspect_ratio`: longer / shorter side above it is skipped), from
the flags `--image-size`, `--resize-mode`, `--max-aspect`."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest
from PIL import Image
from typer.testing import CliRunner

from media_factory import real_photos
from shardsmith import cli


def build(src: Path, out: Path, *flags, code: int = 0) -> list[dict]:
    """Build a png wds output of ``src`` through the CLI; every sample's json with its decoded image. ``code``:
    the exit code expected (3: a build that writes no sample)."""
    r = CliRunner().invoke(cli.app, ["build", "--source", str(src), "--to", "wds", "--image-format", "png",
                                     "--out", str(out), "--quiet", "--workers", "1", *map(str, flags)])
    assert r.exit_code == code, r.output
    got = []
    if not (out / "wds" / "00000.tar").exists():  # nothing written
        return got
    with tarfile.open(out / "wds" / "00000.tar") as t:
        members = {m.name: t.extractfile(m).read() for m in t.getmembers()}
    for name, data in members.items():
        if name.endswith(".json"):
            meta = json.loads(data)
            meta["image"] = Image.open(io.BytesIO(members[name[:-4] + "png"])).convert("RGB")
            got.append(meta)
    return got


@pytest.fixture
def photos(tmp_path) -> Path:
    real_photos(tmp_path / "photos", 6, seed=11, min_side=70, max_side=200)  # aspect 0.5 .. 2
    return tmp_path / "photos"


def test_center_crop_is_size_by_size_from_the_shorter_side(photos, tmp_path):
    got = build(photos, tmp_path / "o", "--image-size", 64, "--resize-mode", "center_crop")
    assert len(got) == 6
    for s in got:
        assert s["size"] == [64, 64] and s["image"].size == (64, 64)


def test_center_crop_is_the_default_mode(photos, tmp_path):
    got = build(photos, tmp_path / "o", "--image-size", 48)
    assert all(s["image"].size == (48, 48) for s in got) and len(got) == 6


def test_keep_ratio_scales_the_shorter_side_and_keeps_the_aspect(photos, tmp_path):
    got = build(photos, tmp_path / "o", "--image-size", 64, "--resize-mode", "keep_ratio")
    assert len(got) == 6
    for s in got:
        (w0, h0), (w, h) = s["original_size"], s["image"].size
        assert min(w, h) == 64
        assert abs(max(w, h) - round(max(w0, h0) * 64 / min(w0, h0))) <= 1


def test_border_scales_the_longer_side_and_pads_with_the_background(photos, tmp_path):
    got = build(photos, tmp_path / "o", "--image-size", 64, "--resize-mode", "border", "--background", "0,255,0")
    elongated = 0
    for s in got:
        (w0, h0), img = s["original_size"], s["image"]
        assert img.size == (64, 64)
        inner = (64, round(min(w0, h0) * 64 / max(w0, h0)))  # longer side, shorter side inside
        if inner[1] <= 60:  # a visible band: its corners are the fill colour, exactly (png)
            elongated += 1
            assert img.getpixel((0, 0)) == (0, 255, 0) and img.getpixel((63, 63)) == (0, 255, 0)
            middle = img.getpixel((32, 32))
            assert middle != (0, 255, 0)
    assert elongated  # the photos include elongated ones (aspect 0.5 .. 2)


def test_nothing_is_enlarged_without_upscale(tmp_path):
    real_photos(tmp_path / "small", 2, seed=2, min_side=30, max_side=40)
    cropped = build(tmp_path / "small", tmp_path / "c", "--image-size", 64, code=3)
    assert cropped == []  # skipped:too_small, named in the manifest (and the build's last line: exit 3)
    m = json.loads((tmp_path / "c" / "manifest.json").read_text())
    assert m["counts"]["skipped"] == {"too_small": 2}
    assert "images.upscale" in json.dumps(m["counts"]["examples"])
    padded = build(tmp_path / "small", tmp_path / "b", "--image-size", 64, "--resize-mode", "border")
    assert [s["image"].size for s in padded] == [(64, 64)] * 2  # padded around the unscaled image
    enlarged = build(tmp_path / "small", tmp_path / "u", "--image-size", 64, "--upscale")
    assert [s["image"].size for s in enlarged] == [(64, 64)] * 2


def test_max_aspect_skips_elongated_images(photos, tmp_path):
    sizes = {p.name: Image.open(p).size for p in photos.glob("*.jpg")}
    want = sorted(n for n, (w, h) in sizes.items() if max(w, h) <= 1.3 * min(w, h))
    assert 0 < len(want) < len(sizes)  # the photos straddle the limit
    got = build(photos, tmp_path / "o", "--max-aspect", 1.3)
    assert sorted(Path(s["path"]).name for s in got) == want
    m = json.loads((tmp_path / "o" / "manifest.json").read_text())
    assert m["counts"]["skipped"] == {"aspect_ratio": len(sizes) - len(want)}


def test_size_and_max_side_together_are_refused(photos, tmp_path):
    r = CliRunner().invoke(cli.app, ["build", "--source", str(photos), "--to", "wds", "--image-size", "64",
                                     "--max-side", "128", "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and "max_side (128) and size (64) are both set" in r.output, r.output


def test_an_unknown_resize_mode_names_the_modes(photos, tmp_path):
    r = CliRunner().invoke(cli.app, ["build", "--source", str(photos), "--to", "wds", "--image-size", "64",
                                     "--resize-mode", "fixed", "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and "resize_mode" in r.output and "center_crop" in r.output, r.output
