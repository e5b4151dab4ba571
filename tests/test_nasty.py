"""A folder of nasty inputs: no crash, every input accounted for with a precise reason, and the
pictures that are written come out upright, sRGB, RGB and composited."""

import json

import numpy as np
import pytest

from media_factory import nasty_folder
from shardsmith.build import build
from shardsmith.plan.ledger import Ledger
from shardsmith.recipe import recipe_from_dict
from test_build import read_wds

EXPECTED = {  # file -> status in the wds output (no size floor, no upscaling needed)
    "truncated.jpg": "failed:truncated",
    "zero_byte.jpg": "failed:empty_file",
    "not_an_image.jpg": "failed:not_an_image",
    "bomb.png": "failed:decompression_bomb",
    "caption_latin1.jpg": "failed:caption_not_utf8",
    "duplicate_b.jpg": "skipped:duplicate",
}


@pytest.fixture(scope="module")
def nasty_build(tmp_path_factory):
    root = tmp_path_factory.mktemp("nasty")
    files = nasty_folder(root / "src")
    rec = recipe_from_dict({"sources": [{"path": str(root / "src"), "license": "CC0-1.0"}],
                            "outputs": [{"format": "wds", "samples_per_shard": 8, "image": {"format": "png"}},
                                        {"format": "zip", "resolution": 32, "transform": "center-crop"}]})
    m = build(rec, root / "out", quiet=True, workers=2)
    led = Ledger(root / "out/.shardsmith/ledger.sqlite")
    status = {out: {iid.split("/", 1)[1]: (st, det) for _, iid, st, det in led.status_rows(out)}
              for out in ("wds", "zip")}
    led.close()
    media = {f for f in files if not f.endswith(".txt")}
    return root, m, status, media


def test_every_input_has_its_precise_reason(nasty_build):
    root, m, status, media = nasty_build
    assert set(status["wds"]) == media  # every media file planned, nothing invented
    for f in media:
        assert status["wds"][f][0] == EXPECTED.get(f, "written"), (f, status["wds"][f])
    # the ZIP additionally refuses images smaller than 32 px (no upscale asked)
    for f in media:
        want = EXPECTED.get(f) or ("skipped:too_small" if f in ("tiny.png", "gif_frame.gif") else "written")
        assert status["zip"][f][0] == want, (f, status["zip"][f])
    for f, (st, detail) in status["wds"].items():
        if st != "written":
            assert f.split(".")[0] in detail or f in detail  # the message names the item
    assert "caption_errors: replace" in status["wds"]["caption_latin1.jpg"][1]
    assert "images.max_pixels" in status["wds"]["bomb.png"][1]
    c = m["counts"]
    assert c["inputs"] == len(media)
    assert c["inputs"] == c["written"] + sum(c["skipped"].values()) + sum(c["failed"].values())


def test_written_pictures_are_normalised(nasty_build):
    root, m, status, media = nasty_build
    by_path = {}
    for shard in read_wds(root / "out/wds").values():
        for s in shard:
            assert "." not in s["__key__"] and " " not in s["__key__"]
            by_path[s["json"]["path"]] = s
    assert len(by_path) == m["outputs"]["wds"]["counts"]["written"]
    for f, s in by_path.items():
        assert s["png"].mode == "RGB", f
    ex = by_path["exif_rotated.jpg"]
    assert ex["json"]["original_size"][0] > ex["json"]["original_size"][1]  # stored landscape
    assert ex["png"].height > ex["png"].width  # written upright (portrait)
    assert ex["json"]["notes"]["exif_transposed"] == 6
    assert by_path["cmyk.jpg"]["json"]["notes"].get("cmyk_converted") or \
        by_path["cmyk.jpg"]["json"]["notes"].get("icc_to_srgb")
    sixteen = np.asarray(by_path["sixteen_bit.png"]["png"])
    assert 20 < sixteen.mean() < 235 and sixteen.std() > 10  # real content, not black or white
    assert by_path["sixteen_bit.png"]["json"]["notes"]["bit_depth_reduced"].startswith("I")
    pal = np.asarray(by_path["palette_alpha.png"]["png"])
    assert (pal[0, 0] == 255).all()  # transparent corner composited on the white background
    assert by_path["palette_alpha.png"]["json"]["notes"]["alpha_composited"]
    assert by_path["adobe_rgb.jpg"]["json"]["notes"]["icc_to_srgb"]
    assert "icc_to_srgb" not in by_path["srgb_icc.jpg"]["json"]["notes"]
    assert by_path["good_caption.jpg"]["txt"] == "naïve 🌸 café"
    for name in ("name.with.many.dots.jpg", "name with spaces.jpg", "ünïcødé 名前.jpg", "UPPER_EXT.JPG",
                 "png_disguised.jpg", "gif_frame.gif", "webp_photo.webp", "bmp_photo.bmp", "tiff_photo.tif"):
        assert name in by_path, name
    assert by_path["gif_frame.gif"]["json"]["notes"]["frames"] > 1
    assert all(s["json"]["license"] == "CC0-1.0" for s in by_path.values())


def test_caption_errors_replace_keeps_the_item(tmp_path):
    files = nasty_folder(tmp_path / "src")
    assert "caption_latin1.txt" in files
    rec = recipe_from_dict({"sources": [{"path": str(tmp_path / "src"), "caption_errors": "replace"}],
                            "outputs": [{"format": "wds"}]})
    m = build(rec, tmp_path / "out", quiet=True)
    assert "caption_not_utf8" not in m["counts"]["failed"]
    caps = {s["json"]["path"]: s.get("txt") for sh in read_wds(tmp_path / "out/wds").values() for s in sh}
    assert caps["caption_latin1.jpg"] == "caf\ufffd cr\ufffdme"


def test_manifest_counts_equal_a_row_by_row_tally(nasty_build):
    """The manifest counts written items in SQL and walks only the others: the same blocks (counts,
    reasons, examples) as tallying every row, per output and overall (worst status per item)."""
    from shardsmith import report

    root, m, _, _ = nasty_build
    led = Ledger(root / "out/.shardsmith/ledger.sqlite")
    try:
        for out in ("wds", "zip"):
            total, splits = report.tally(led.status_rows(out))
            assert (m["outputs"][out]["counts"], m["outputs"][out]["splits"]) == (total, splits)
        per_item: dict = {}
        for idx, split, iid, st, det in led.db.execute(
                "SELECT i.idx, i.split, i.item_id, r.status, r.detail FROM items i "
                "LEFT JOIN results r ON r.idx=i.idx ORDER BY i.idx"):
            per_item.setdefault(idx, (split, iid, []))[2].append((st, det))
        total, splits = report.tally((s, i, *report.worst(sts)) for s, i, sts in per_item.values())
        assert (m["counts"], m["splits"]) == (total, splits)
        assert m["counts"]["written"] < m["counts"]["inputs"]  # the fixture has every kind of outcome
    finally:
        led.close()
