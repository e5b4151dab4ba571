"""AVIF photos are images (Pillow 13 reads them); HEIC / HEIF photos are images too, and without the
pillow-heif plugin each fails with the reason and the fix instead of being passed over as non-media."""

from __future__ import annotations

import io
import json
import tarfile

import numpy as np
from PIL import Image

from media_factory import real_photos
from shardsmith.build import build
from shardsmith.recipe import recipe_from_dict
from shardsmith.sources.base import media_kind
from shardsmith.transform import image as image_mod


def test_avif_heic_and_heif_are_image_extensions():
    assert [media_kind(f"a.{e}") for e in ("avif", "AVIF", "heic", "HEIF")] == ["image"] * 4


def test_an_avif_photo_is_built_and_a_heic_without_the_plugin_fails_naming_the_fix(tmp_path):
    src = tmp_path / "p"
    [jpg] = real_photos(src, 1, seed=7, min_side=60, max_side=90)
    photo = Image.open(jpg).convert("RGB")
    photo.save(src / "phone.avif", "AVIF", quality=90)
    jpg.unlink()
    # the first bytes of an iPhone HEIC (an ISO-BMFF 'ftyp' box of brand 'heic') and a body Pillow cannot read
    (src / "iphone.heic").write_bytes(b"\x00\x00\x00\x18ftypheic\x00\x00\x00\x00mif1heic" + bytes(200))
    rec = {"sources": [{"path": str(src)}], "split": {"holdout": 0},
           "outputs": [{"format": "wds", "dir": "wds", "image": {"format": "png"}}]}
    m = build(recipe_from_dict(rec), tmp_path / "out", quiet=True, workers=1)
    counts = m["outputs"]["wds"]["counts"]
    assert counts["written"] == 1 and m["counts"]["inputs"] == 2
    with tarfile.open(tmp_path / "out" / "wds" / "00000.tar") as tf:
        members = {x.name: tf.extractfile(x).read() for x in tf.getmembers()}
    got = np.asarray(Image.open(io.BytesIO(members["phone.png"])))
    want = np.asarray(Image.open(src / "phone.avif").convert("RGB"))
    assert got.shape == want.shape and np.array_equal(got, want)  # AVIF decoded, stored as asked (png)
    if not image_mod.HEIF_PLUGIN:
        assert counts["failed"] == {"heif_needs_plugin": 1}
        from shardsmith import formats
        from shardsmith.plan.ledger import Ledger

        led = Ledger(tmp_path / "out" / formats.LEDGER_FILE)
        try:
            [(item, status, detail)] = led.result_details("wds", "train", "failed:%")
        finally:
            led.close()
        assert item == "p/iphone.heic" and "pip install pillow-heif" in detail
    assert json.loads((tmp_path / "out" / "manifest.json").read_text())["counts"]["inputs"] == 2
