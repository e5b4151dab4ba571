"""``decode`` of a ``latent_wds`` build pairs each latent with its own source, exactly.

Before: the samples were matched with the ledger's items by media path with the suffix swapped, so two
sources ``x.jpg`` and ``x.png`` were both ``x.pt``: both latents were compared with the same source (the one
planned last) and both decoded into ``x.png``, the second replacing the first. Now a sample is its item by
the item id its json records (else its sample key) and is named by the item's ``sample_rel`` (``x.png``,
``x_<8 hex>.png``), as in a ``.precomputed/`` tree.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from media_factory import source_photo
from test_cli_mistakes import invoke

SIDE = 64  # the sources are the bucket's size: the bucketed source is the file's own pixels


@pytest.fixture(scope="module")
def twin_build(tmp_path_factory) -> Path:
    """A latent_wds build (tiny random-weight SD VAE, CPU) of ``x.jpg`` (astronaut) and ``x.png`` (cat)."""
    from shardsmith.build import build
    from shardsmith.recipe import recipe_from_dict

    root = tmp_path_factory.mktemp("twins")
    src = root / "src"
    src.mkdir()
    source_photo("astronaut").convert("RGB").resize((SIDE, SIDE)).save(src / "x.jpg", quality=95)
    source_photo("chelsea").convert("RGB").resize((SIDE, SIDE)).save(src / "x.png")
    build(recipe_from_dict({
        "sources": [{"path": str(src)}], "geometry": {"buckets": [f"{SIDE}x{SIDE}x1"]},
        "models": {"vae": {"family": "sd", "config": "tiny"}, "device": "cpu"},
        "outputs": [{"format": "latent_wds", "dir": "latents", "latent_dtype": "float32"}]}), root / "out", quiet=True)
    return root


def _pixels(path: Path) -> np.ndarray:
    from PIL import Image

    with Image.open(path) as im:
        return np.asarray(im.convert("RGB"))[None]  # [1, H, W, 3], as decode compares


@pytest.mark.slow
def test_decode_pairs_x_jpg_and_x_png_each_with_its_own_source(twin_build, tmp_path):
    from shardsmith.verify.decode import psnr

    code, output = invoke("decode", twin_build / "out", "--out", tmp_path / "dec", "--device", "cpu", "-q")
    assert code == 0, output
    rows = json.loads((tmp_path / "dec" / "decode_report.json").read_text())["rows"]
    assert len(rows) == 2, rows
    # two files: neither decoded picture replaced the other
    files = [r["file"] for r in rows]
    assert len(set(files)) == 2 and all((tmp_path / "dec" / f).is_file() for f in files), files
    assert len({r["path"] for r in rows}) == 2, rows
    # each row says which source it was compared with: its own
    by_id = {r["id"]: r for r in rows}
    assert set(by_id) == {"src/x.jpg", "src/x.png"}, rows
    sources = {i: _pixels(twin_build / i) for i in by_id}
    for ident, row in by_id.items():
        decoded = _pixels(tmp_path / "dec" / row["file"])
        other = next(i for i in sources if i != ident)
        own, wrong = psnr(sources[ident], decoded), psnr(sources[other], decoded)
        assert abs(own - wrong) > 0.01  # the two sources differ enough to tell the pairings apart
        assert row["psnr_db"] == pytest.approx(own, abs=2e-3), (ident, row, own, wrong)


def _item(relpath: str, key: str) -> SimpleNamespace:
    return SimpleNamespace(relpath=relpath, source=0, key=key, item_id=f"src/{relpath}")


def test_samples_find_a_latent_wds_sample_by_its_item_id_not_its_media_path():
    """Both samples' media paths give ``x.pt``; each is found as its own item, under its own path."""
    from shardsmith.formats.wds import unique_key
    from shardsmith.verify.decode import Samples

    png_key = unique_key("x", "src/x.png")
    jpg, png = _item("x.jpg", "x"), _item("x.png", png_key)
    recipe = SimpleNamespace(sources=[SimpleNamespace(name="src")], outputs=[SimpleNamespace(name="o", sources=None)])
    samples = Samples([jpg, png], recipe, "o")
    got_jpg = samples.find("x.pt", {"id": "src/x.jpg", "path": "x.jpg"}, "x")
    got_png = samples.find("x.pt", {"id": "src/x.png", "path": "x.png"}, png_key)
    assert got_jpg == ("x.pt", jpg)
    assert got_png[1] is png and got_png[0] == f"{png_key}.pt"
    # without an id in its json (an older shard), the sample key finds it
    assert samples.find("x.pt", {"path": "x.png"}, png_key)[1] is png
    # a .precomputed/ file is found by its path in the tree
    assert samples.find(f"{png_key}.pt", {}, None) == (f"{png_key}.pt", png)
    # a sample the ledger does not hold is compared with nothing and replaces no other sample's file
    assert samples.find("x.pt", {"id": "src/other.jpg", "path": "x.gif"}, "zz") == ("x_zz.pt", None)
