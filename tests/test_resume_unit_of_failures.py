"""A build stopped after a unit's shard was renamed into place but before the ledger recorded it,
resumed when every item of that unit now fails (its sources changed or vanished since the plan):
the unit writes nothing, and the shard of the earlier attempt is gone too, so the folder, the
count files, the manifest and ``verify`` agree (was: the uncommitted ``00001.tar`` stayed beside
the committed shards, loaders globbing ``*.tar`` read its samples and verify failed on it)."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest

from media_factory import real_photos
from shardsmith.build import build
from shardsmith.plan.ledger import Ledger
from shardsmith.recipe import recipe_from_dict
from shardsmith.records import WRITTEN, SampleResult
from shardsmith.sinks.bucketed_wds import BucketedWdsSink
from shardsmith.verify.runner import verify
from test_build import balanced, read_wds


def _stopped_before_second_commit(rec, out: Path, monkeypatch) -> None:
    """Build ``rec`` into ``out``, stopped as a kill would stop it: unit 1's files are in place, its
    ledger record is not (the first unit is committed)."""
    commit, seqs = Ledger.commit_unit, []

    def stops(self, **kw):
        seqs.append(kw["seq"])
        if len(seqs) == 2:
            raise KeyboardInterrupt
        commit(self, **kw)

    monkeypatch.setattr(Ledger, "commit_unit", stops)
    with pytest.raises(KeyboardInterrupt):
        build(rec, out, quiet=True, workers=1)
    monkeypatch.setattr(Ledger, "commit_unit", commit)
    assert seqs == [0, 1] and not (out / "manifest.json").exists()


def _break_sources_of(shards: list[Path], src: Path) -> list[str]:
    """Every source file whose sample ``shards`` hold: the first rewritten with other bytes, the rest
    removed; their names."""
    names = []
    for shard in shards:
        with tarfile.open(shard) as t:
            names += [Path(json.load(t.extractfile(m))["path"]).name for m in t if m.name.endswith(".json")]
    assert names
    (src / names[0]).write_bytes(b"not a jpeg any more")
    for n in names[1:]:
        (src / n).unlink()
    return sorted(names)


def test_a_resumed_unit_whose_items_all_fail_leaves_no_shard_of_its_earlier_attempt(tmp_path, monkeypatch):
    src = tmp_path / "src"
    real_photos(src, 6, seed=3, min_side=64, max_side=120)
    rec = recipe_from_dict({"sources": [{"path": str(src)}],
                            "outputs": [{"format": "wds", "samples_per_shard": 3,
                                         "image": {"format": "jpg", "max_side": 64}}]})
    out = tmp_path / "out"
    _stopped_before_second_commit(rec, out, monkeypatch)
    wds_dir = out / "wds"
    assert sorted(p.name for p in wds_dir.iterdir()) == ["00000.tar", "00001.tar"]  # 00001: uncommitted
    first = (wds_dir / "00000.tar").read_bytes()
    broken = _break_sources_of([wds_dir / "00001.tar"], src)

    m = build(rec, out, quiet=True, workers=1)

    c = m["counts"]
    assert (c["inputs"], c["written"]) == (6, 3) and balanced(c)
    assert c["failed"] == {"changed_since_plan": 1, "vanished": 2}
    assert sorted(p.name for p in wds_dir.iterdir()) == ["00000.tar", "shard_count.json"]
    assert (wds_dir / "00000.tar").read_bytes() == first
    assert json.loads((wds_dir / "shard_count.json").read_text()) == {"00000.tar": 3}
    assert [s["name"] for s in m["outputs"]["wds"]["files"]["train"]["shards"]] == ["00000.tar"]
    samples = read_wds(wds_dir)
    assert {k: len(v) for k, v in samples.items()} == {"00000.tar": 3}
    assert not {Path(s["json"]["path"]).name for s in samples["00000.tar"]} & set(broken)
    rep = verify(wds_dir, world=1, workers=1)
    assert rep["ok"], [ch for ch in rep["checks"] if not ch["ok"]]


@pytest.mark.slow
def test_a_resumed_bucketed_latent_unit_whose_items_all_fail_leaves_no_shard_in_any_bucket(tmp_path, monkeypatch):
    """The same with an encoder (the unit sealed, written on the writer thread) and a shard per bucket:
    none of the earlier attempt's bucket shards of unit 1 stays."""
    src = tmp_path / "src"
    real_photos(src, 6, seed=3, min_side=64, max_side=160)
    rec = recipe_from_dict({"sources": [{"path": str(src)}],
                            "geometry": {"buckets": ["64x64x1", "96x64x1", "64x96x1"]}, "images": {"upscale": True},
                            "models": {"vae": {"family": "sd", "config": "tiny"}, "text": {"family": "minilm"},
                                       "device": "cpu"},
                            "outputs": [{"format": "latent_wds", "dir": "lat", "samples_per_shard": 3}]})
    out = tmp_path / "out"
    _stopped_before_second_commit(rec, out, monkeypatch)
    lat = out / "lat"
    stale = sorted(lat.glob("*/00001.tar"))
    assert len(stale) >= 2  # the earlier attempt of unit 1 wrote a shard in more than one bucket
    _break_sources_of(stale, src)

    m = build(rec, out, quiet=True, workers=1)

    assert (m["counts"]["inputs"], m["counts"]["written"]) == (6, 3) and balanced(m["counts"])
    assert sorted(lat.glob("*/*.tar")) == sorted(lat.glob("*/00000.tar"))
    shards = m["outputs"]["latent_wds"]["files"]["train"]["shards"]
    assert sorted(s["name"] for s in shards) == sorted(p.relative_to(lat).as_posix() for p in lat.glob("*/*.tar"))
    assert sum(s["count"] for s in shards) == 3
    rep = verify(lat, world=1, workers=1)
    assert rep["ok"], [ch for ch in rep["checks"] if not ch["ok"]]


def _sample(idx: int, bucket: str) -> tuple[str, SampleResult]:
    return f"k{idx}", SampleResult(idx, WRITTEN, members={"txt": f"sample {idx}".encode()}, info={"bucket": bucket})


def test_a_bucketed_unit_rewritten_without_a_bucket_removes_that_bucket_s_earlier_shard(tmp_path):
    """A unit written again (a resume) whose items of one bucket now fail: its shard in that bucket's
    folder from the earlier attempt goes; other units' shards stay; ``drop_unit`` clears every bucket."""
    sink = BucketedWdsSink(None, tmp_path)
    sink.write_unit(0, [_sample(0, "64x64x1"), _sample(1, "96x64x1")])
    sink.write_unit(1, [_sample(2, "64x64x1"), _sample(3, "96x64x1")])  # the earlier, uncommitted attempt
    again = sink.write_unit(1, [_sample(2, "64x64x1")])
    assert [f.name for f in again.files] == ["64x64x1/00001.tar"] and again.files[0].count == 1
    on_disk = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.glob("*/*.tar"))
    assert on_disk == ["64x64x1/00000.tar", "64x64x1/00001.tar", "96x64x1/00000.tar"]
    with tarfile.open(tmp_path / "64x64x1" / "00001.tar") as t:
        assert t.getnames() == ["k2.txt"]
    sink.drop_unit(1)
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.glob("*/*.tar")) == [
        "64x64x1/00000.tar", "96x64x1/00000.tar"]
