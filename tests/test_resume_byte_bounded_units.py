"""An output cut by bytes (``max_shard_bytes``) with an encoder: its units are cut as they are written and
written on the writer threads, so several shards can be on disk before the ledger records them. A build
stopped then, resumed when the items of the first unrecorded shard now fail, cuts fewer units: the shards
past its last unit that the earlier attempt left go, so the folder, ``shard_count.json``, the manifest,
``verify`` and the loader agree with the ledger (was: ``00002.tar`` stayed, holding again the samples the
resumed ``00001.tar`` holds; loaders globbing ``*.tar`` read them twice and verify failed on it)."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from media_factory import real_photos
from shardsmith.build import build
from shardsmith.distribute import local
from shardsmith.formats.build_dir import LEDGER_FILE
from shardsmith.plan.ledger import Ledger
from shardsmith.recipe import recipe_from_dict
from shardsmith.records import WRITTEN, SampleResult
from shardsmith.sinks.wds import WdsSink
from shardsmith.verify.runner import verify
from test_build import balanced, read_wds
from test_resume_unit_of_failures import _break_sources_of, _stopped_before_second_commit


def _stopped_with_two_shards_unrecorded(rec, out: Path, monkeypatch) -> None:
    """:func:`_stopped_before_second_commit`, with unit 0's file held until the last unit is sealed, so that
    units 1 and 2 are both written when the record of unit 1 stops the build."""
    at_end = threading.Event()
    ready, write = local._Writer._write_ready, WdsSink.write_unit

    def write_ready(self, block_over):
        if block_over == 0:  # the end of the split: every unit is sealed
            at_end.set()
        return ready(self, block_over)

    def held_write(self, seq, samples):
        if seq == 0:
            assert at_end.wait(120)
        return write(self, seq, samples)

    monkeypatch.setattr(local._Writer, "_write_ready", write_ready)
    monkeypatch.setattr(WdsSink, "write_unit", held_write)
    _stopped_before_second_commit(rec, out, monkeypatch)
    led = Ledger(out / LEDGER_FILE)
    try:
        assert led.last_unit(rec.outputs[0].name, "train")[0] == 0
    finally:
        led.close()


def _recipe(src: Path, buckets: list[str]):
    return recipe_from_dict({"sources": [{"path": str(src)}],
                             "geometry": {"buckets": buckets}, "images": {"upscale": True},
                             "models": {"vae": {"family": "sd", "config": "tiny"}, "text": {"family": "minilm"},
                                        "device": "cpu"},
                             "outputs": [{"format": "latent_wds", "dir": "lat", "samples_per_shard": 3,
                                          "max_shard_bytes": 1 << 30}]})


@pytest.mark.slow
def test_a_resume_that_cuts_fewer_units_leaves_no_later_shard_of_the_earlier_attempt(tmp_path, monkeypatch):
    src = tmp_path / "src"
    real_photos(src, 9, seed=3, min_side=64, max_side=120)
    rec = _recipe(src, ["64x64x1"])
    out = tmp_path / "out"
    _stopped_with_two_shards_unrecorded(rec, out, monkeypatch)
    lat = out / "lat"
    assert sorted(p.name for p in lat.glob("*.tar")) == ["00000.tar", "00001.tar", "00002.tar"]
    first = (lat / "00000.tar").read_bytes()
    broken = _break_sources_of([lat / "00001.tar"], src)  # unit 1's items fail: the resume cuts 2 units, not 3
    WdsSink(None, lat).write_unit(99999, [_sample("theirs")])  # a shard past the units, not the build's

    m = build(rec, out, quiet=True, workers=1)

    c = m["counts"]
    assert (c["inputs"], c["written"]) == (9, 6) and balanced(c)
    assert c["failed"] == {"changed_since_plan": 1, "vanished": 2}
    assert sorted(p.name for p in lat.glob("*.tar")) == ["00000.tar", "00001.tar", "99999.tar"]
    (lat / "99999.tar").unlink()  # (a file the build did not write stays: verify would name it)
    assert (lat / "00000.tar").read_bytes() == first
    assert json.loads((lat / "shard_count.json").read_text()) == {"00000.tar": 3, "00001.tar": 3}
    assert [s["name"] for s in m["outputs"]["latent_wds"]["files"]["train"]["shards"]] == ["00000.tar", "00001.tar"]
    samples = read_wds(lat)
    keys = [s["__key__"] for shard in samples.values() for s in shard]
    assert len(keys) == len(set(keys)) == 6
    assert not {Path(s["json"]["path"]).name for shard in samples.values() for s in shard} & set(broken)
    rep = verify(lat, world=1, workers=1)
    assert rep["ok"], [ch for ch in rep["checks"] if not ch["ok"]]


@pytest.mark.slow
def test_the_same_with_buckets_leaves_no_later_shard_in_any_bucket_folder(tmp_path, monkeypatch):
    """The same with a shard per bucket (``<bucket>/NNNNN.tar``): no bucket folder keeps a shard of unit 2."""
    src = tmp_path / "src"
    real_photos(src, 9, seed=3, min_side=64, max_side=160)
    rec = _recipe(src, ["64x64x1", "96x64x1", "64x96x1"])
    out = tmp_path / "out"
    _stopped_with_two_shards_unrecorded(rec, out, monkeypatch)
    lat = out / "lat"
    assert sorted({p.name for p in lat.glob("*/*.tar")}) == [
        "00000.tar", "00001.tar", "00002.tar"]
    _break_sources_of(sorted(lat.glob("*/00001.tar")), src)

    m = build(rec, out, quiet=True, workers=1)

    assert (m["counts"]["inputs"], m["counts"]["written"]) == (9, 6) and balanced(m["counts"])
    on_disk = sorted(p.relative_to(lat).as_posix() for p in lat.glob("*/*.tar"))
    assert not [p for p in on_disk if p.endswith("00002.tar")]
    shards = m["outputs"]["latent_wds"]["files"]["train"]["shards"]
    assert sorted(s["name"] for s in shards) == on_disk and sum(s["count"] for s in shards) == 6
    rep = verify(lat, world=1, workers=1)
    assert rep["ok"], [ch for ch in rep["checks"] if not ch["ok"]]


def _sample(key: str) -> tuple[str, SampleResult]:
    return key, SampleResult(0, WRITTEN, members={"txt": key.encode()})


def test_drop_units_after_removes_only_later_shards_of_planned_samples(tmp_path):
    """Shards past the last committed unit whose samples are all planned go; a committed one, one holding a
    sample the plan does not have (the user's), a file that is no tar and other names stay."""
    sink = WdsSink(None, tmp_path)
    for seq, keys in ((0, ["a", "b"]), (1, ["c"]), (2, ["d", "e"]), (4, ["f"]), (5, ["g", "user"])):
        sink.write_unit(seq, [_sample(k) for k in keys])
    (tmp_path / "00006.tar").write_bytes(b"not a tar")
    (tmp_path / "mine.tar").write_bytes((tmp_path / "00004.tar").read_bytes())
    planned = set("abcdefg")
    assert sink.drop_units_after(1, lambda keys: set(keys) <= planned) == ["00002.tar", "00004.tar"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["00000.tar", "00001.tar", "00005.tar", "00006.tar",
                                                          "mine.tar"]
