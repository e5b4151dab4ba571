"""Units as jobs (issue 15): the unit plan is known before any item is transformed, unit jobs
run in any order give the same bytes and the same ledger, a job run whole in another process
writes the same file, and a recipe with two latent outputs encodes each item once."""

from __future__ import annotations

import os
import pickle
import random
import sqlite3

import pytest

from media_factory import real_photos
from shardsmith import formats
from shardsmith.build import build
from shardsmith.distribute import local
from shardsmith.encode.stage import EncodeStage
from shardsmith.outputs import OutputContext, kind_of
from shardsmith.plan.ledger import Ledger
from shardsmith.recipe import recipe_from_dict
from shardsmith.sources import open_sources
from shardsmith.units.job import run_unit, unit_items
from shardsmith.units.plan import UnitJob, plan_units, unit_at
from test_build import tree_bytes

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def test_the_unit_plan_is_a_pure_function_of_the_eligible_count():
    assert plan_units("o", "train", 10, 4) == [UnitJob("o", "train", 0, 0, 4), UnitJob("o", "train", 1, 4, 8),
                                               UnitJob("o", "train", 2, 8, 10)]
    assert plan_units("o", "train", 0, 4) == []
    assert [j.size for j in plan_units("o", "holdout", 9, 3)] == [3, 3, 3]
    # a plan still growing takes the same units as the complete plan
    for pos in range(10):
        grown = unit_at("o", "train", pos, 4)
        final = unit_at("o", "train", pos, 4, eligible=10)
        assert final in plan_units("o", "train", 10, 4)
        assert (grown.seq, grown.first_pos) == (final.seq, final.first_pos)
    with pytest.raises(ValueError):
        plan_units("o", "train", 3, 0)


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    d = tmp_path_factory.mktemp("photos")
    real_photos(d, 23, seed=5, min_side=40, max_side=160)
    names = sorted(d.glob("*.jpg"))
    names[4].write_bytes(names[4].read_bytes()[:300])  # truncated: fails at decode, inside a unit
    names[13].write_bytes(names[13].read_bytes()[:300])
    return d


def _cpu_recipe(src):
    return recipe_from_dict({
        "sources": [{"path": str(src)}], "split": {"holdout": 4, "seed": 2},
        "images": {"min_size": 48},
        "outputs": [{"format": "wds", "dir": "w", "samples_per_shard": 3, "image": {"max_side": 64}},
                    {"format": "zip", "path": "c.zip", "resolution": 32, "unit": 4}]})


def _ledger_rows(out):
    db = sqlite3.connect(out / formats.LEDGER_FILE)
    try:
        return (sorted(db.execute("SELECT * FROM results").fetchall()),
                sorted(db.execute("SELECT * FROM shards").fetchall()))
    finally:
        db.close()


def _shuffled(seed):
    def order(jobs):
        jobs = list(jobs)
        random.Random(seed).shuffle(jobs)
        assert len(jobs) < 2 or jobs != sorted(jobs, key=lambda j: j.seq) or seed == 0
        return jobs
    return order


@pytest.mark.slow  # 3-7 s under load: the fast lane keeps under two minutes
def test_unit_jobs_in_a_shuffled_order_give_the_same_bytes_and_ledger(photos, tmp_path, monkeypatch):
    rec = _cpu_recipe(photos)
    build(rec, tmp_path / "in_order", quiet=True, workers=2)
    seen = []

    def order(jobs):
        jobs = list(jobs)
        random.Random(len(seen) + 7).shuffle(jobs)
        seen.append([j.seq for j in jobs])
        return jobs

    monkeypatch.setattr(local, "ORDER", order)
    build(rec, tmp_path / "shuffled", quiet=True, workers=2)
    assert any(s != sorted(s) for s in seen), seen  # some split really ran out of order
    a, b = tree_bytes(tmp_path / "in_order"), tree_bytes(tmp_path / "shuffled")
    assert len([k for k in a if k.endswith(".tar")]) >= 5 and a.keys() == b.keys()
    assert a == b
    assert _ledger_rows(tmp_path / "in_order") == _ledger_rows(tmp_path / "shuffled")
    # a unit holds its planned items whatever failed among them: the truncated photos leave short shards
    results, shards = _ledger_rows(tmp_path / "in_order")
    failed = [r for r in results if r[2].startswith("failed:")]
    assert {r[0] for r in failed} == {"wds", "zip"} and len(failed) == 4
    for out, split, seq, name, first, nxt, count, *_ in shards:
        per = 3 if out == "wds" else 4
        assert first == seq * per and nxt - first <= per and count <= nxt - first


def test_a_unit_job_pickled_and_run_whole_writes_the_builds_file(photos, tmp_path):
    rec = _cpu_recipe(photos)
    out = tmp_path / "b"
    build(rec, out, quiet=True, workers=1)
    ledger = Ledger(out / formats.LEDGER_FILE)
    try:
        o = rec.outputs[0]
        infos = [i for i, _ in open_sources(rec)]
        octx = OutputContext(rec, out, ledger, infos, lambda: None)
        kind = kind_of(o)
        srcs = rec.source_ids(o)
        unit = ledger.units(o.name, "train")[1]
        job = UnitJob(o.name, "train", unit["seq"], unit["first_pos"], unit["next_pos"])
        items = list(unit_items(ledger, job, srcs))
        again = tmp_path / "again"
        job2, items2, maker, sink = pickle.loads(pickle.dumps((job, items, kind.maker(o, octx),
                                                                kind.sink(o, octx, again, "train"))))
        rec2 = run_unit(job2, items2, maker, sink)
    finally:
        ledger.close()
    assert (rec2.name, rec2.nbytes, rec2.sha256, rec2.count) == (unit["name"], unit["bytes"], unit["sha256"],
                                                                  unit["count"])
    assert (again / unit["name"]).read_bytes() == (out / "w" / unit["name"]).read_bytes()


def _latent_recipe(src, **extra):
    return recipe_from_dict({
        "sources": [{"path": str(src)}], "split": {"holdout": 3, "seed": 1},
        "geometry": {"buckets": ["64x64x1", "64x48x1"]}, "images": {"upscale": True},
        "models": {"vae": {"family": "sd"}, "text": {"family": "minilm"}, "batch_size": 3},
        "outputs": [{"format": "precomputed", "unit": 4, "latent_dtype": "float32"},
                    {"format": "latent_wds", "dir": "lat", "samples_per_shard": 5}], **extra})


@pytest.fixture(scope="module")
def captioned(tmp_path_factory):
    d = tmp_path_factory.mktemp("captioned")
    real_photos(d, 14, seed=8, min_side=60, max_side=140)
    for i, p in enumerate(sorted(d.glob("*.jpg"))):
        p.with_suffix(".txt").write_text(f"photo {i % 5}", encoding="utf-8")  # some captions repeat
    return d


def _count_encoders(monkeypatch) -> dict[str, int]:
    counts = {"vae_items": 0, "text_prompts": 0}
    from shardsmith.encode import text_memory

    launch, encode = EncodeStage.launch, text_memory.encode_halving

    def launch_spy(self, host, n=None, *a, **k):
        counts["vae_items"] += host.shape[0] if n is None else n
        return launch(self, host, n, *a, **k)

    def text_spy(encoder, prompts, *a, **k):  # the prompts asked for (a text batch's padding rows not counted)
        counts["text_prompts"] += len(prompts)
        return encode(encoder, prompts, *a, **k)

    monkeypatch.setattr(EncodeStage, "launch", launch_spy)
    for mod in ("shardsmith.encode.stage", "shardsmith.encode.caption_cache", "shardsmith.encode.text_pass"):
        monkeypatch.setattr(f"{mod}.encode_halving", text_spy)
    return counts


@pytest.mark.slow
def test_two_latent_outputs_encode_each_item_once(captioned, tmp_path, monkeypatch):
    counts = _count_encoders(monkeypatch)
    out = tmp_path / "both"
    m = build(_latent_recipe(captioned), out, quiet=True, workers=2)
    written = {name: o["counts"]["written"] for name, o in m["outputs"].items()}
    assert written == {"precomputed": 14, "latent_wds": 14}
    assert counts["vae_items"] == 14  # not 28: the second output reads what the first encoded
    # 5 distinct captions, the negative prompt, and a prompt per split's neg_prompt_emb.npy at most
    assert counts["text_prompts"] <= 5 + 2
    assert not (out / formats.STATE_DIR / "encoded").exists()  # the kept results go once all is written

    # the first output's bytes are those it has alone; the second holds the very same latents
    first = _latent_recipe(captioned)
    first.outputs = first.outputs[:1]
    build(first, tmp_path / "alone", quiet=True, workers=2)
    both, alone = tree_bytes(out), tree_bytes(tmp_path / "alone")
    assert {k: both[k] for k in alone if k.startswith(".precomputed")} == \
        {k: v for k, v in alone.items() if k.startswith(".precomputed")}
    import io
    import tarfile

    import torch

    seen = 0
    for shard in sorted(out.glob("lat/**/*.tar")) + sorted(out.glob("holdout/lat/**/*.tar")):
        pre = out / ("holdout/.precomputed" if "holdout" in shard.parts else ".precomputed") / "latents"
        with tarfile.open(shard) as tar:
            for m in tar:
                if m.name.endswith(".latent.pth"):
                    z = torch.load(io.BytesIO(tar.extractfile(m).read()), weights_only=True)
                    stem = m.name.split(".")[0]  # one source: the key is the file's stem
                    rec = torch.load(pre / f"{stem}.pt", weights_only=True)
                    assert torch.equal(rec["latents"][:, 0], z), m.name
                    seen += 1
    assert seen == 14


@pytest.mark.slow
def test_latent_unit_jobs_in_a_shuffled_order_give_the_same_bytes(captioned, tmp_path, monkeypatch):
    import shardsmith.build as build_mod

    monkeypatch.setattr(build_mod, "PLAN_AHEAD", False)  # units planned ahead, not taken as the plan runs
    build(_latent_recipe(captioned), tmp_path / "a", quiet=True, workers=2)
    monkeypatch.setattr(local, "ORDER", lambda jobs: list(reversed(list(jobs))))
    build(_latent_recipe(captioned), tmp_path / "b", quiet=True, workers=2)
    a, b = tree_bytes(tmp_path / "a"), tree_bytes(tmp_path / "b")
    assert len([k for k in a if k.endswith(".tar")]) >= 3 and a == b  # (one folder per bucket)
    assert _ledger_rows(tmp_path / "a") == _ledger_rows(tmp_path / "b")
