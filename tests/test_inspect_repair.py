"""inspect / repair on real shards: truncation, corrupt members, foreign datasets, key problems."""

import hashlib
import io
import json
import shutil
import tarfile
from pathlib import Path

import pytest
import webdataset as wds

from media_factory import real_photos
from shardsmith.build import build
from shardsmith.formats import IGNORE_INDEX_FILE, SHARD_COUNT_FILE
from shardsmith.recipe import recipe_from_dict
from shardsmith.formats.wds import list_shards
from shardsmith.verify.empty_batches import diagnose_empty
from shardsmith.verify.inspect import format_inspect, inspect_wds
from shardsmith.verify.repair import format_repair, repair_wds


def tar_members(path: Path) -> list[tuple[str, bytes]]:
    with tarfile.open(path) as t:
        return [(m.name, t.extractfile(m).read()) for m in t.getmembers() if m.isreg()]


def tree_bytes(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def keys_of(members):
    out = []
    for name, _ in members:
        k = name.split(".", 1)[0]
        if not out or out[-1] != k:
            out.append(k)
    return out


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("ir")
    real_photos(d / "src", 20, seed=5, min_side=64, max_side=160)
    rec = recipe_from_dict({"sources": [{"path": str(d / "src")}],
                            "outputs": [{"format": "wds", "dir": "wds", "samples_per_shard": 5,
                                         "image": {"format": "jpg", "quality": 90, "max_side": 96}}]})
    build(rec, d / "out", quiet=True)
    wdir = d / "out" / "wds"
    assert json.loads((wdir / SHARD_COUNT_FILE).read_text()) == {f"{i:05d}.tar": 5 for i in range(4)}
    return wdir


@pytest.fixture
def damaged(built, tmp_path):
    """A copy with 00001.tar cut inside the 3rd sample's jpg and one corrupt jpg in 00002.tar."""
    wdir = tmp_path / "wds"
    shutil.copytree(built, wdir)
    orig1 = tar_members(wdir / "00001.tar")
    with tarfile.open(wdir / "00001.tar") as t:
        infos = [m for m in t.getmembers() if m.isreg()]
    third_key = keys_of(orig1)[2]
    jpg = next(m for m in infos if m.name == f"{third_key}.jpg")
    cut = jpg.offset_data + jpg.size // 2
    data = (wdir / "00001.tar").read_bytes()
    (wdir / "00001.tar").write_bytes(data[:cut])

    orig2 = tar_members(wdir / "00002.tar")
    bad_key = keys_of(orig2)[1]
    garbage = bytes((i * 37 + 11) % 251 for i in range(len(dict(orig2)[f"{bad_key}.jpg"])))
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as t:
        for name, b in orig2:
            b = garbage if name == f"{bad_key}.jpg" else b
            info = tarfile.TarInfo(name)
            info.size = len(b)
            t.addfile(info, io.BytesIO(b))
    (wdir / "00002.tar").write_bytes(buf.getvalue())
    return {"dir": wdir, "orig1": orig1, "cut": cut, "third_key": third_key, "bad_key": bad_key}


def test_inspect_clean_build(built):
    rep = inspect_wds(built, key_map={"real": "jpg", "meta": "json"})
    assert rep["ok"], rep["problems"]
    assert rep["totals"]["samples"] == 20 and rep["totals"]["shards"] == 4
    for s in rep["shards"]:
        assert s["samples"] == 5 and s["suffix_counts"] == {"jpg": 5, "json": 5}
        assert s["count_status"] == "ok" and not s["truncated"] and not s["corrupt"]
    json.dumps(rep)
    assert "OK" in format_inspect(rep)
    diag = diagnose_empty(rep, world_size=1, workers=2)
    assert diag["verdict"] is None
    diag = diagnose_empty(rep, world_size=2, workers=4)
    assert diag["verdict"] == "partitioning"
    assert "4 shard(s) for 8 rank-workers: 4 would be empty" in diag["explanation"]


def test_inspect_reports_truncation_and_corrupt_member(damaged):
    rep = inspect_wds(damaged["dir"])
    s1, s2 = rep["shards"][1], rep["shards"][2]
    t = s1["truncated"]
    assert t and t["kind"] == "truncated member" and t["member"] == f"{damaged['third_key']}.jpg"
    assert t["intact_members"] == 4 and t["intact_samples"] == 2
    assert t["break_offset"] == damaged["cut"] and t["broken_key"] == damaged["third_key"]
    assert s1["count_status"] == "mismatch"
    assert [c["member"] for c in s2["corrupt"]] == [f"{damaged['bad_key']}.jpg"]
    assert s2["corrupt"][0]["key"] == damaged["bad_key"] and s2["count_status"] == "ok"
    assert not rep["ok"] and rep["totals"]["truncated_shards"] == 1
    text = format_inspect(rep)
    assert "TRUNCATED" in text and f"{damaged['bad_key']}.jpg" in text
    assert diagnose_empty(rep, 1, 1)["verdict"] == "tar_members"


def test_repair_rewrites_truncated_and_ignores_corrupt(damaged):
    wdir = damaged["dir"]
    shard2_before = (wdir / "00002.tar").read_bytes()
    truncated_bytes = (wdir / "00001.tar").read_bytes()
    rep = repair_wds(wdir)
    assert not rep["errors"]
    e1, e2 = rep["shards"]["00001.tar"], rep["shards"]["00002.tar"]
    assert e1["action"] == "rewritten" and e1["samples_after"] == 2 and e1["backup"] == "00001.tar.orig"
    assert e1["dropped_keys"] == [damaged["third_key"]]
    assert e2 == {**e2, "action": "ignored_keys", "ignored_keys": [damaged["bad_key"]],
                  "samples_before": 5, "samples_after": 5, "backup": None}
    assert rep["shards"]["00000.tar"]["action"] == "unchanged"

    # no intact sample lost: the kept members are exactly the originals before the cut, byte for byte
    new1 = tar_members(wdir / "00001.tar")
    assert new1 == damaged["orig1"][:4]
    assert keys_of(new1) == keys_of(damaged["orig1"])[:2]
    assert (wdir / "00001.tar.orig").read_bytes() == truncated_bytes  # original kept
    assert (wdir / "00002.tar").read_bytes() == shard2_before  # corrupt shard not rewritten
    assert json.loads((wdir / IGNORE_INDEX_FILE).read_text()) == {"00002.tar": [damaged["bad_key"]]}
    assert json.loads((wdir / SHARD_COUNT_FILE).read_text()) == {
        "00000.tar": 5, "00001.tar": 2, "00002.tar": 5, "00003.tar": 5}
    assert (wdir / (SHARD_COUNT_FILE + ".orig")).exists()  # previous count file kept
    assert "00001.tar.orig" in format_repair(rep)

    samples = list(wds.WebDataset(str(wdir / "00001.tar"), shardshuffle=False).decode("pil"))
    assert [s["__key__"] for s in samples] == keys_of(damaged["orig1"])[:2]
    assert all(s["jpg"].size[0] > 0 for s in samples)
    assert list_shards(wdir).names == [f"{i:05d}.tar" for i in range(4)]  # .orig not a shard

    after = inspect_wds(wdir)
    assert after["shards"][1]["truncated"] is None and after["shards"][1]["count_status"] == "ok"
    assert after["ignore_index"]["valid"] == {"00002.tar": [damaged["bad_key"]]}
    assert after["totals"]["samples"] == 17 and after["totals"]["usable_samples"] == 16

    # a second repair finds nothing new to do and writes nothing
    snap = tree_bytes(wdir)
    again = repair_wds(wdir)
    assert {e["action"] for e in again["shards"].values()} == {"unchanged"}
    assert tree_bytes(wdir) == snap


def test_dry_run_writes_nothing(damaged):
    wdir = damaged["dir"]
    snap = tree_bytes(wdir)
    rep = repair_wds(wdir, dry_run=True)
    assert rep["dry_run"] and rep["shards"]["00001.tar"]["action"] == "rewritten"
    assert rep["shards"]["00002.tar"]["ignored_keys"] == [damaged["bad_key"]]
    assert rep["shard_count"]["changed"] and not rep["shard_count"]["written"]
    assert not rep["ignore_index"]["written"]
    assert tree_bytes(wdir) == snap


def test_plain_shardwriter_dataset(tmp_path):
    photos = real_photos(tmp_path / "p", 7, seed=2, min_side=48, max_side=96)
    wdir = tmp_path / "plain"
    wdir.mkdir()
    with wds.ShardWriter(str(wdir / "shard-%06d.tar"), maxcount=3, verbose=0) as sink:
        for i, p in enumerate(photos):
            sink.write({"__key__": f"s{i:03d}", "jpg": p.read_bytes(), "txt": f"photo {i}", "cls": i % 3})
    rep = inspect_wds(wdir, key_map={"real": "jpg", "condition": "txt"})
    assert [s["samples"] for s in rep["shards"]] == [3, 3, 1]
    assert rep["order_note"] and "sorts shards by name" in rep["order_note"]
    assert not rep["count_file"]["present"]
    assert all(not s["corrupt"] and not s["truncated"] and not s["missing"] for s in rep["shards"])
    assert diagnose_empty(rep, 1, 2)["verdict"] is None

    fixed = repair_wds(wdir)
    assert {e["action"] for e in fixed["shards"].values()} == {"unchanged"}
    assert json.loads((wdir / SHARD_COUNT_FILE).read_text()) == {
        "shard-000000.tar": 3, "shard-000001.tar": 3, "shard-000002.tar": 1}
    assert not (wdir / IGNORE_INDEX_FILE).exists()
    assert inspect_wds(wdir)["count_file"]["mismatches"] == {}


def _write_tar(path: Path, members: list[tuple[str, bytes]]) -> None:
    with tarfile.open(path, "w") as t:
        for name, b in members:
            info = tarfile.TarInfo(name)
            info.size = len(b)
            t.addfile(info, io.BytesIO(b))


def test_non_adjacent_dotted_keys_and_checklist(tmp_path):
    jpgs = [p.read_bytes() for p in real_photos(tmp_path / "p", 4, seed=4, min_side=32, max_side=64)]
    wdir = tmp_path / "odd"
    wdir.mkdir()
    _write_tar(wdir / "00000.tar", [("a.jpg", jpgs[0]), ("b.jpg", jpgs[1]), ("b.txt", b"bee"),
                                    ("a.txt", b"ay")])
    _write_tar(wdir / "00001.tar", [("c.v2.jpg", jpgs[2]), ("c.v2.txt", b"see"),
                                    ("d.jpg", jpgs[3]), ("d.txt", b"dee"), ("e.cls", b"x")])
    _write_tar(wdir / "00002.tar", [("f.jpg", jpgs[0]), ("f.txt", b"\xff\xfe")])
    (wdir / IGNORE_INDEX_FILE).write_text(json.dumps({"00001.tar": ["d", "zz"], "00009.tar": ["q"]}))
    rep = inspect_wds(wdir, key_map={"real": "jpg", "condition": "txt"})
    s0, s1, s2 = rep["shards"]
    assert s0["samples"] == 3 and s0["non_adjacent"] == [{"key": "a", "member": "a.txt", "sample_index": 2}]
    dotted = {d["member"]: d for d in s1["dotted_members"]}
    assert set(dotted) == {"c.v2.jpg", "c.v2.txt"}
    assert dotted["c.v2.jpg"]["likely_key"] == "c.v2" and dotted["c.v2.jpg"]["likely_suffix"] == "jpg"
    assert s1["missing"] == {"jpg": ["c", "e"], "txt": ["c", "e"]}
    assert [c["member"] for c in s1["corrupt"]] == ["e.cls"]
    assert [c["member"] for c in s2["corrupt"]] == ["f.txt"]
    assert rep["ignore_index"]["valid"] == {"00001.tar": ["d"]}
    assert rep["ignore_index"]["unknown_keys"] == {"00001.tar": ["zz"]}
    assert rep["ignore_index"]["unknown_shards"] == ["00009.tar"]
    text = format_inspect(rep)
    assert "appears again" in text and "'c.v2'" in text

    (tmp_path / "neg.npy").write_bytes(b"")
    diag = diagnose_empty(rep, world_size=2, workers=4, files_map={"neg": "neg.npy", "other": "missing.npy"})
    items = {c["item"]: c for c in diag["checks"]}
    assert diag["verdict"] == "tar_members"
    assert items["key_map_coverage"]["status"] == "problem"
    assert items["filters"]["status"] == "unknown"
    assert "3 shard(s) for 8 rank-workers: 5 would be empty" in items["partitioning"]["detail"]
    assert items["files_map"]["status"] == "problem" and "missing.npy" in items["files_map"]["detail"]
    assert "neg.npy" not in items["files_map"]["detail"]

    # repair: corrupt members are ignored (merged with the existing list), tars untouched
    before = {p.name: p.read_bytes() for p in wdir.glob("*.tar")}
    fixed = repair_wds(wdir)
    assert json.loads((wdir / IGNORE_INDEX_FILE).read_text()) == {
        "00001.tar": ["d", "zz", "e"], "00009.tar": ["q"], "00002.tar": ["f"]}
    assert fixed["shards"]["00000.tar"]["action"] == "unchanged"
    assert any("non-adjacent" in n for n in fixed["shards"]["00000.tar"]["notes"])
    assert {p.name: p.read_bytes() for p in wdir.glob("*.tar")} == before
    assert json.loads((wdir / SHARD_COUNT_FILE).read_text()) == {"00000.tar": 3, "00001.tar": 3, "00002.tar": 1}


def test_cut_at_member_boundary_and_garbage_header(built, tmp_path):
    wdir = tmp_path / "wds"
    shutil.copytree(built, wdir)
    orig = tar_members(wdir / "00003.tar")
    with tarfile.open(wdir / "00003.tar") as t:
        infos = [m for m in t.getmembers() if m.isreg()]
    # cut right after the 2nd sample's jpg: no end marker, the 2nd sample lost its json
    end = infos[2].offset_data + -(-infos[2].size // 512) * 512
    data = (wdir / "00003.tar").read_bytes()
    (wdir / "00003.tar").write_bytes(data[:end])
    # 00000.tar: garbage where the 4th sample's header was
    orig0 = tar_members(wdir / "00000.tar")
    d0 = bytearray((wdir / "00000.tar").read_bytes())
    with tarfile.open(wdir / "00000.tar") as t:
        regs = [m for m in t.getmembers() if m.isreg()]
        h, resume = regs[6].offset, regs[7].offset
    d0[h:h + 512] = b"\x07" * 512
    (wdir / "00000.tar").write_bytes(bytes(d0))

    rep = inspect_wds(wdir)
    t3, t0 = rep["shards"][3]["truncated"], rep["shards"][0]["truncated"]
    assert t3["kind"] == "missing end-of-archive marker" and t3["intact_members"] == 3
    assert t3["intact_samples"] == 1 and t3["incomplete_keys"] == [keys_of(orig)[1]]
    # reading resumes at the next valid header: only the 4th sample (which lost its jpg) is damaged
    s0 = rep["shards"][0]
    assert t0 is None and s0["damaged_headers"] == [{"offset": h, "resumed_at": resume, "name": None}]
    assert [d["key"] for d in s0["damaged_samples"]] == [keys_of(orig0)[3]]

    fixed = repair_wds(wdir)
    assert fixed["shards"]["00003.tar"]["samples_after"] == 1
    assert fixed["shards"]["00003.tar"]["dropped_keys"] == [keys_of(orig)[1]]
    assert tar_members(wdir / "00003.tar") == orig[:2]
    assert fixed["shards"]["00000.tar"]["samples_after"] == 4
    assert fixed["shards"]["00000.tar"]["dropped_keys"] == [keys_of(orig0)[3]]
    assert tar_members(wdir / "00000.tar") == orig0[:6] + orig0[8:]
    assert inspect_wds(wdir)["ok"]
    assert sum(1 for _ in wds.WebDataset(str(wdir / "00000.tar"), shardshuffle=False)) == 4
    h0 = hashlib.sha256(bytes(d0)).hexdigest()
    assert hashlib.sha256((wdir / "00000.tar.orig").read_bytes()).hexdigest() == h0


def test_multi_dot_suffixes_and_pth_checks(tmp_path):
    import torch

    good = io.BytesIO()
    torch.save(torch.zeros(4, 8, 8), good)
    wdir = tmp_path / "lat"
    wdir.mkdir()
    _write_tar(wdir / "00000.tar", [("g.latent.pth", good.getvalue()), ("g.txt", b"gee"),
                                    ("h.latent.pth", b"\x80\x02not a pickle"), ("h.txt", b"aitch")])
    rep = inspect_wds(wdir, key_map={"real": "latent.pth", "condition": "txt"})
    s = rep["shards"][0]
    assert s["suffix_counts"] == {"latent.pth": 2, "txt": 2} and s["samples"] == 2
    assert not s["dotted_members"] and not s["missing"]
    assert [c["member"] for c in s["corrupt"]] == ["h.latent.pth"]
