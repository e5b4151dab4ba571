"""A ``.precomputed/`` build stopped after a unit's ``.pt`` files were written but before the ledger
recorded the unit, resumed when some of that unit's items now fail (their sources changed or vanished
since the plan): the files the earlier attempt wrote under those items' names go, so the tree, the
manifest, ``verify`` and the LTX loader agree with the ledger (was: ``latents/`` and ``conditions/`` kept
the failed items' files, the trainer listing ``latents/`` read each as a sample the ledger says failed,
the manifest counted them and verify failed on its ``manifest`` check)."""

from __future__ import annotations

from pathlib import Path

import pytest

from media_factory import real_photos
from shardsmith.build import build
from shardsmith.formats import precomputed as layout
from shardsmith.formats.build_dir import LEDGER_FILE
from shardsmith.loaders.precomputed import PrecomputedDataset
from shardsmith.plan.ledger import Ledger
from shardsmith.recipe import recipe_from_dict
from shardsmith.sinks.precomputed import PrecomputedSink
from shardsmith.verify.runner import verify
from test_build import balanced
from test_resume_unit_of_failures import _stopped_before_second_commit


def _pts(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*.pt"))


@pytest.mark.slow
def test_a_resumed_precomputed_unit_leaves_no_file_of_an_item_that_now_fails(tmp_path, monkeypatch):
    src = tmp_path / "src"
    real_photos(src, 6, seed=3, min_side=64, max_side=120)
    rec = recipe_from_dict({"sources": [{"path": str(src)}],
                            "geometry": {"buckets": ["64x64x1"]}, "images": {"upscale": True},
                            "models": {"vae": {"family": "sd", "config": "tiny"}, "text": {"family": "minilm"},
                                       "device": "cpu"},
                            "outputs": [{"format": "precomputed", "unit": 3, "latent_dtype": "float32"}]})
    out = tmp_path / "out"
    _stopped_before_second_commit(rec, out, monkeypatch)
    pre = out / ".precomputed"
    led = Ledger(out / LEDGER_FILE)
    try:
        committed = {idx for idx, _, _ in led.written("precomputed", "train")}
        unit1 = [it for it in led.items(split="train", status="ok") if it.idx not in committed]
    finally:
        led.close()
    assert len(committed) == 3 and len(unit1) == 3
    names = [Path(it.relpath).stem for it in unit1]
    assert {f"latents/{n}.pt" for n in names} <= set(_pts(pre))  # the uncommitted attempt's files
    (src / unit1[0].relpath).write_bytes(b"not a jpeg any more")  # fails: changed_since_plan
    (src / unit1[1].relpath).unlink()  # fails: vanished; unit1[2] is written again
    kept = [p for p in _pts(pre) if Path(p).stem not in names[:2]]
    committed_bytes = {p: (pre / p).read_bytes() for p in kept if Path(p).stem not in names}

    m = build(rec, out, quiet=True, workers=1)

    c = m["counts"]
    assert (c["inputs"], c["written"]) == (6, 4) and balanced(c)
    assert c["failed"] == {"changed_since_plan": 1, "vanished": 1}
    assert _pts(pre) == kept  # the failed items' files are gone, every other item's are there
    assert all((pre / p).read_bytes() == b for p, b in committed_bytes.items())  # unit 0's, as committed
    assert m["outputs"]["precomputed"]["files"]["train"]["files"] == {"latents": 4, "conditions": 4}
    ds = PrecomputedDataset(pre)
    assert len(ds) == 4 and not {Path(r).stem for r in ds.items} & set(names[:2])
    rep = verify(pre, world=1, workers=1)
    assert rep["ok"], [ch for ch in rep["checks"] if not ch["ok"]]


def test_drop_items_removes_only_the_named_items_files_in_every_folder(tmp_path):
    """``drop_items`` removes a named item's file from every folder shardsmith writes (a kill may have left
    only some of them); a file under another name (the user's, a written item's) stays."""
    sink = PrecomputedSink(None, tmp_path)
    for sub in (layout.LATENTS, layout.CONDITIONS, layout.AUDIO_LATENTS):
        for rel in ("clips/a.pt", "clips/b.pt", "mine.pt"):
            (tmp_path / sub / rel).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / sub / rel).write_bytes(b"x")
    (tmp_path / layout.AUDIO_LATENTS / "clips/a.pt").unlink()
    assert sink.drop_items(["clips/a.pt", "gone.pt"]) == 2
    assert _pts(tmp_path) == sorted(f"{sub}/{rel}" for sub in (layout.LATENTS, layout.CONDITIONS,
                                                              layout.AUDIO_LATENTS)
                                    for rel in ("clips/b.pt", "mine.pt"))
