"""The ``.precomputed/`` tree's stamp (the encoders' identities) is checked at the first write, not when the
sink is made: asking the encode stage for it at the start held back every decode until the models had loaded,
so a video build's first clips were decoded only after the load instead of during it."""

from __future__ import annotations

import json
import time

import pytest

from media_factory import real_photos
from shardsmith.build import build
from shardsmith.formats.precomputed import PRECOMPUTED_STAMP
from shardsmith.recipe import recipe_from_dict
from shardsmith.records import SampleResult
from shardsmith.sinks.precomputed import PrecomputedSink, condition_record, latent_record, pt_bytes


def _recipe(src, **models):
    return recipe_from_dict({
        "sources": [{"path": str(src)}], "geometry": {"buckets": ["64x64x1"]}, "images": {"upscale": True},
        "models": {"vae": {"family": "sd"}, "text": {"family": "minilm"}, "batch_size": 4, **models},
        "outputs": [{"format": "precomputed", "latent_dtype": "float32", "unit": 2}]})


def _sample(name: str) -> SampleResult:
    import torch

    members = {f"latents/{name}.pt": pt_bytes(latent_record(torch.zeros(4, 1, 8, 8), 24.0)),
               f"conditions/{name}.pt": pt_bytes(condition_record(torch.zeros(4, 8), torch.ones(4)))}
    return SampleResult(0, "written", members=members, info={"bucket": "64x64x1"})


def test_the_stamp_is_asked_for_at_the_first_write_and_a_foreign_tree_is_refused_before_it(tmp_path):
    recipe = _recipe(tmp_path)
    asked = []

    def stamp():
        asked.append(time.perf_counter())
        return {"vae": {"family": "sd", "config": "tiny"}, "buckets": ["64x64x1"]}

    dest = tmp_path / ".precomputed"
    sink = PrecomputedSink(recipe.outputs[0], dest, stamp=stamp)
    assert asked == [] and not dest.exists()  # making the sink asks nothing of the encoders
    sink.write_unit(0, [("a", _sample("a"))])
    assert len(asked) == 1 and json.loads((dest / PRECOMPUTED_STAMP).read_text())["vae"]["config"] == "tiny"
    sink.write_unit(1, [("b", _sample("b"))])
    assert len(asked) == 1  # once per sink

    # the same tree, now met by a build whose encoders differ: refused at the first write, nothing written
    other = PrecomputedSink(recipe.outputs[0], dest, stamp=lambda: {"vae": {"family": "sd", "config": "published"},
                                                                    "buckets": ["64x64x1"]})
    with pytest.raises(ValueError, match="built with different encoders or geometry; refusing to mix"):
        other.write_unit(2, [("c", _sample("c"))])
    assert sorted(p.name for p in (dest / "latents").iterdir()) == ["a.pt", "b.pt"]

    # a split with no samples still gets its stamp
    empty = tmp_path / "empty" / ".precomputed"
    PrecomputedSink(recipe.outputs[0], empty, stamp=stamp).finalize([])
    assert (empty / PRECOMPUTED_STAMP).is_file()


@pytest.mark.slow
def test_the_first_items_are_decoded_while_the_models_load(tmp_path, monkeypatch):
    """Fails before the fix: the sink asked for the stamp first, so no item was decoded until the load ended."""
    from shardsmith.encode.stage import EncodeStage
    from shardsmith.transform.latent_pixels import LatentPixelMaker

    src = tmp_path / "src"
    real_photos(src, 12, seed=31, min_side=60, max_side=140)
    for i, p in enumerate(sorted(src.glob("*.jpg"))):
        p.with_suffix(".txt").write_text(f"photo {i}", encoding="utf-8")
    calls = tmp_path / "decoded.txt"
    loaded: list[float] = []
    slow_load = 3.0
    made = EncodeStage.from_recipe.__func__
    decode = LatentPixelMaker.__call__

    def from_recipe(cls, recipe, offload=None):
        stage = made(cls, recipe, offload)
        time.sleep(slow_load)  # a model that takes a while to load, as on a GPU machine
        loaded.append(time.time())
        return stage

    def timed_decode(self, item):
        with open(calls, "a", encoding="utf-8") as f:  # (a forked decode worker: through a file)
            f.write(f"{time.time()}\n")
        return decode(self, item)

    monkeypatch.setattr(EncodeStage, "from_recipe", classmethod(from_recipe))
    monkeypatch.setattr(LatentPixelMaker, "__call__", timed_decode)
    manifest = build(_recipe(src), tmp_path / "out", quiet=True, workers=2)
    assert manifest["counts"]["written"] == 12
    first_decode = min(float(t) for t in calls.read_text().split())
    assert len(loaded) == 1
    assert first_decode < loaded[0] - 1.0, (first_decode, loaded[0])  # decoding began well before the load ended
    assert len(list((tmp_path / "out" / ".precomputed" / "latents").rglob("*.pt"))) == 12
    assert (tmp_path / "out" / ".precomputed" / PRECOMPUTED_STAMP).is_file()
