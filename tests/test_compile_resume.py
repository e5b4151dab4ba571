"""``models.compile`` as a build began is kept in its ledger: a resume follows it, whatever the recipe's
``auto`` would now decide (compiled and eager latents differ in their last bits), and the manifest says which
was followed. On the CPU with a quick compile backend (Dynamo's ``eager``); ``tests/test_compile_cuda.py`` checks
the bytes with Inductor on a GPU."""

from __future__ import annotations

import os

import pytest

from media_factory import real_photos
from shardsmith.build import build
from shardsmith.encode.compile_record import LEDGER_KEY
from shardsmith.encode.stage import EncodeStage
from shardsmith.plan.ledger import Ledger
from shardsmith.recipe import recipe_from_dict
from test_build import tree_bytes

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _recipe(photos, compile: str, device: str = "auto"):
    return recipe_from_dict({"sources": [{"path": str(photos)}], "geometry": {"buckets": ["32x32x1"]},
                             "images": {"upscale": True}, "split": {"holdout": 0},
                             "models": {"vae": {"family": "sd"}, "batch_size": 3, "compile": compile,
                                        "device": device},
                             "outputs": [{"format": "latent_wds", "dir": "lat", "samples_per_shard": 2}]})


@pytest.mark.slow
def test_a_resume_with_compile_auto_follows_the_compiled_start(tmp_path, monkeypatch, disk_full_at):
    monkeypatch.setattr(EncodeStage, "compile_backend", "eager")  # (aot_eager trips on the build's channels-last input on CPU)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    real_photos(tmp_path / "p", 9, seed=12, min_side=40, max_side=90)
    build(_recipe(tmp_path / "p", "on"), tmp_path / "ref", quiet=True, workers=1)
    disk_full_at(2)
    with pytest.raises(OSError, match="No space left"):
        build(_recipe(tmp_path / "p", "on"), tmp_path / "o", quiet=True, workers=1)
    disk_full_at(None)
    # before, auto on this resume decided afresh (here: eager, off the GPU), and wrote the rest eager
    m = build(_recipe(tmp_path / "p", "auto"), tmp_path / "o", quiet=True, workers=1)
    c = m["models"]["compile"]
    assert c["setting"] == "auto" and c["compiled"] is True and c["compiled_at_batch"] == 0
    assert c["reason"] == "auto: as this build began (on in the recipe (models.compile))"
    assert m["counts"]["written"] == 9 and tree_bytes(tmp_path / "o") == tree_bytes(tmp_path / "ref")
    assert Ledger.peek(tmp_path / "o" / ".shardsmith" / "ledger.sqlite", LEDGER_KEY) == (
        {"compiled": True, "reason": "on in the recipe (models.compile)"},)


@pytest.mark.slow
def test_a_fresh_build_keeps_its_decision_in_the_ledger(tmp_path):
    real_photos(tmp_path / "p", 4, seed=3, min_side=40, max_side=90)
    m = build(_recipe(tmp_path / "p", "auto", device="cpu"), tmp_path / "o", quiet=True, workers=1)
    assert m["models"]["compile"] == {"setting": "auto", "compiled": False, "reason": "auto: stays eager off the GPU",
                                        "decided_in": "first batch"}
    ledger = tmp_path / "o" / ".shardsmith" / "ledger.sqlite"
    assert Ledger.peek(ledger, LEDGER_KEY) == ({"compiled": False, "reason": "auto: stays eager off the GPU"},)
