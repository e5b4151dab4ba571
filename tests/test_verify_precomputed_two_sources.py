"""Two sources with a file of the same name (``a/cat.jpg``, ``b/cat.jpg``), each taken by its own
``.precomputed/`` output (``sources: [a]`` / ``[b]``): each tree names its sample ``cat.pt``. verify and inspect
of ``pa`` named the samples of every source, so ``cat.pt`` was taken for ``b``'s item: check integrity failed a
pristine tree ('.pt file(s) the build did not write: latents/cat.pt ... move the file(s) ... out of pa', the
build's own latents), its unit was silently not compared, and decode paired ``pa``'s ``cat.pt`` with ``b``'s
photo. Now only the items of the output's own sources are named, as its sink named them."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

import shardsmith
from media_factory import real_photos
from tests.test_cli_mistakes import invoke
from tests.test_verify_integrity_sha import check


def _item(idx: int, source: int, name: str, relpath: str) -> SimpleNamespace:
    return SimpleNamespace(idx=idx, relpath=relpath, source=source, key=f"{name}_{relpath.split('.')[0]}",
                           item_id=f"{name}/{relpath}")


def test_samples_of_an_output_are_its_own_sources_items():
    from shardsmith.verify.decode import Samples

    recipe = SimpleNamespace(sources=[SimpleNamespace(name="a"), SimpleNamespace(name="b")],
                             outputs=[SimpleNamespace(name="pa", sources=["a"]),
                                      SimpleNamespace(name="pb", sources=["b"])])
    items = [_item(0, 0, "a", "cat.jpg"), _item(1, 0, "a", "coffee.jpg"), _item(2, 1, "b", "cat.jpg"),
             _item(3, 1, "b", "rocket.jpg")]
    pa, pb = Samples(items, recipe, "pa"), Samples(items, recipe, "pb")
    assert {r: it.item_id for r, it in pa.by_rel.items()} == {"cat.pt": "a/cat.jpg", "coffee.pt": "a/coffee.jpg"}
    assert {r: it.item_id for r, it in pb.by_rel.items()} == {"cat.pt": "b/cat.jpg", "rocket.pt": "b/rocket.jpg"}
    assert pa.find("cat.pt", {}, None)[1].item_id == "a/cat.jpg"  # decode-back compares with a's photo


@pytest.fixture(scope="module")
def two_trees(tmp_path_factory) -> Path:
    """A build of sources a (cat, coffee) and b (cat, rocket) into precomputed outputs pa [a] and pb [b]."""
    base = tmp_path_factory.mktemp("two_sources")
    photos = real_photos(base / "photos", 4, seed=5, min_side=64, max_side=96)
    for src, names in (("a", ["cat", "coffee"]), ("b", ["cat", "rocket"])):
        (base / src).mkdir()
        for name in names:
            p = photos.pop()
            (base / src / f"{name}.jpg").write_bytes(p.read_bytes())
            (base / src / f"{name}.txt").write_text(f"a photo of {name} in {src}", encoding="utf-8")
    shardsmith.build({"sources": [{"path": str(base / "a"), "name": "a"}, {"path": str(base / "b"), "name": "b"}],
                      "images": {"upscale": True}, "geometry": {"buckets": ["64x64x1"]},
                      "models": {"vae": {"family": "sd"}, "text": {"family": "minilm"}, "batch_size": 4},
                      "outputs": [{"format": "precomputed", "dir": "pa", "sources": ["a"]},
                                  {"format": "precomputed", "dir": "pb", "sources": ["b"]}]},
                     base / "out", quiet=True)
    return base / "out"


@pytest.mark.slow
@pytest.mark.parametrize("tree", ["pa", "pb"])
def test_a_pristine_tree_of_one_of_two_sources_passes_integrity(two_trees, tree):
    root = two_trees / tree
    assert (root / "latents" / "cat.pt").is_file()
    rep = shardsmith.verify(root).report
    integ = check(rep, "integrity")
    assert rep["ok"] and integ["ok"], rep["checks"]
    assert "not compared" not in integ["detail"], integ  # each unit's samples are named and hashed
    code, out = invoke("verify", root, "-q")
    assert code == 0 and "did not write" not in out, out
    code, out = invoke("inspect", root)
    assert code == 0 and "problem:" not in out and "did not write" not in out, out


@pytest.mark.slow
def test_decode_back_of_one_tree_compares_each_latent_with_its_own_source(two_trees, tmp_path):
    import json

    code, out = invoke("decode", two_trees, "--output", "precomputed", "--out", tmp_path / "dec", "--device", "cpu", "-q")
    assert code == 0, out
    rows = json.loads((tmp_path / "dec" / "decode_report.json").read_text())["rows"]
    assert {r["path"]: r["id"] for r in rows} == {"cat.pt": "a/cat.jpg", "coffee.pt": "a/coffee.jpg"}, rows
