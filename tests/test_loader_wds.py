"""WebDataset loader: plan (pure), coverage across ranks x workers, resume, accounting, safety."""

from __future__ import annotations

import io
import json
import logging
import os
import shutil
import sys
import tarfile
import uuid
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.multiprocessing as tmp_mp

from media_factory import real_photos
from shardsmith.build import build
from shardsmith.formats import IGNORE_INDEX_FILE, SHARD_COUNT_FILE, shard_name
from shardsmith.loaders import PRESETS, WdsLoader, WdsLoaderConfig, empty_slots, plan_slots
from shardsmith.loaders import decoders as dec
from shardsmith.loaders.slots import slot_sample_counts
from shardsmith.recipe import recipe_from_dict

COUNTS = {"00000.tar": 5, "00001.tar": 5, "00002.tar": 5, "00003.tar": 5, "00004.tar": 3}


# ----------------------------------------------------------------------------- helpers

def expand_plan(counts, ignore, world, workers, start):
    """Turn a plan into {slot: [global index...]} by replaying it (the readers' rule)."""
    plan = plan_slots(counts, ignore, world, workers, start)
    n_slots = world * max(workers, 1)
    offs, off = {}, 0
    for s in sorted(counts, key=lambda n: int(n[:-4])):
        offs[s] = off
        off += counts[s] - len(set(ignore.get(s, ())))
    out = {}
    for slot, lst in plan.items():
        gs = []
        for shard, skip in lst:
            n = counts[shard] - len(set(ignore.get(shard, ())))
            assert 0 <= skip < n
            gs += [offs[shard] + i for i in range(skip, n, n_slots)]
        out[slot] = gs
    return out, off


def write_tar_folder(folder: Path, shards: list[list[tuple[str, dict[str, bytes]]]], count_file=True):
    folder.mkdir(parents=True, exist_ok=True)
    counts = {}
    for i, samples in enumerate(shards):
        with tarfile.open(folder / shard_name(i), "w") as tf:
            for key, members in samples:
                for suffix, data in members.items():
                    ti = tarfile.TarInfo(f"{key}.{suffix}")
                    ti.size = len(data)
                    tf.addfile(ti, io.BytesIO(data))
        counts[shard_name(i)] = len(samples)
    if count_file:
        (folder / SHARD_COUNT_FILE).write_text(json.dumps(counts))
    return folder


def keys_of(loader) -> list[str]:
    return [k for b in loader for k in b["__key__"]]


def cfg(folder, **kw):
    base = dict(shards=folder, key_map={"img": "jpg", "caption": "txt", "label": "cls"},
                deterministic=True, batch_size=2, partial=True, image_size=16)
    base.update(kw)
    return WdsLoaderConfig(**base)


# ----------------------------------------------------------------------------- a real dataset

@pytest.fixture(scope="module")
def photos_wds(tmp_path_factory) -> Path:
    """23 real photos in 2 classes with sidecar captions -> 5 shards of 5,5,5,5,3."""
    root = tmp_path_factory.mktemp("lw")
    src = root / "src"
    for cls_name, n, seed in (("cat", 12, 1), ("dog", 11, 2)):
        for p in real_photos(src / cls_name, n, seed=seed, min_side=40, max_side=80):
            p.with_suffix(".txt").write_text(f"  a photo of a {cls_name} named {p.stem}  \n")
    rec = recipe_from_dict({"sources": [{"path": str(src)}],
                            "outputs": [{"format": "wds", "samples_per_shard": 5}]})
    build(rec, root / "out", quiet=True)
    folder = root / "out" / "wds"
    assert json.loads((folder / SHARD_COUNT_FILE).read_text()) == COUNTS
    return folder


@pytest.fixture(scope="module")
def global_order(photos_wds) -> list[str]:
    order = keys_of(WdsLoader(cfg(photos_wds, batch_size=1)))
    assert len(order) == 23 == len(set(order))
    return order


# ----------------------------------------------------------------------------- pure plan

@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("workers", [0, 1, 2, 3, 5])
@pytest.mark.parametrize("start", [0, 1, 7, 10, 22, 23, 30])
def test_plan_covers_tail_exactly_once(world, workers, start):
    ignore = {"00001.tar": ["x"], "00004.tar": ["y", "y"]}  # duplicates count once
    slots, total = expand_plan(COUNTS, ignore, world, workers, start)
    assert total == 21
    s0 = start % total
    n_slots = world * max(workers, 1)
    assert len(slots) == n_slots
    everything = sorted(g for gs in slots.values() for g in gs)
    assert everything == list(range(s0, total))
    for (r, w), gs in slots.items():
        slot = r * max(workers, 1) + w
        assert all((g - s0) % n_slots == slot for g in gs)
        assert gs == sorted(gs)
    counts = slot_sample_counts(COUNTS, ignore, world, workers, start)
    assert {k: len(v) for k, v in slots.items()} == counts


def test_plan_skips_whole_shards_before_start_and_only_lists_needed_shards():
    plan = plan_slots(COUNTS, {}, 1, 0, 12)
    assert plan == {(0, 0): [("00002.tar", 2), ("00003.tar", 0), ("00004.tar", 0)]}
    plan = plan_slots(COUNTS, {}, 2, 4, 0)  # 8 slots, stride 8 > shard size: shards are shared sparsely
    for slot, lst in plan.items():
        assert all(skip < COUNTS[s] for s, skip in lst)
    assert plan[(1, 3)] == [("00001.tar", 2), ("00003.tar", 0)]  # g = 7, 15


def test_empty_slots_reason():
    counts = {"00000.tar": 4, "00001.tar": 3, "00002.tar": 2}
    empty = empty_slots(counts, {}, 4, 4, 0)
    assert len(empty) == 16 - 9
    assert empty[0] == (2, 1, "3 shards, 9 samples for 16 rank-workers")
    assert empty_slots(counts, {}, 3, 3, 0) == []
    assert plan_slots({}, {}, 2, 2, 0) == {(r, w): [] for r in range(2) for w in range(2)}


# ----------------------------------------------------------------------------- real loading

def test_batch_contract(photos_wds):
    loader = WdsLoader(cfg(photos_wds, batch_size=4, image_size=32, partial=False,
                           presets_map={"neg": "empty_string", "neg2": "neg_prompt_wan"}))
    assert len(loader) == 5
    batches = list(loader)
    assert len(batches) == 5
    b = batches[0]
    assert b["img"].dtype == torch.float32 and tuple(b["img"].shape) == (4, 3, 32, 32)
    assert b["img"].min() >= -1.0 and b["img"].max() <= 1.0 and b["img"].min() < -0.5 < 0.5 < b["img"].max()
    assert b["label"].dtype == torch.int64 and tuple(b["label"].shape) == (4,)
    assert isinstance(b["caption"], list) and all(isinstance(c, str) for c in b["caption"])
    for key, cap, lab in zip(b["__key__"], b["caption"], b["label"].tolist()):
        name = ["cat", "dog"][lab]
        assert cap == f"a photo of a {name} named {key.rsplit('_', 2)[-2]}_{key.rsplit('_', 1)[-1]}"
    assert b["neg"] == [""] * 4 and b["neg2"] == [PRESETS["neg_prompt_wan"]] * 4
    assert b["__shard__"][0] == "00000.tar"
    # 23 = 5*4 + 3: the incomplete last batch is counted, not silently lost
    assert loader.stats["samples"] == 20 and loader.stats["dropped"] == {"incomplete_batch": 3}
    assert loader.stats["read"] == 23
    # without image_size: uint8 HWC, differing sizes come as a list
    raw = next(iter(WdsLoader(cfg(photos_wds, image_size=None, key_map={"img": "jpg"}))))
    assert isinstance(raw["img"], list) and raw["img"][0].dtype == torch.uint8 and raw["img"][0].shape[-1] == 3


@pytest.mark.parametrize("workers", [0, 1, 2, 3])
def test_deterministic_coverage_ranks_x_workers(photos_wds, global_order, workers):
    for world in (1, 2, 3):
        seen = []
        for rank in range(world):
            loader = WdsLoader(cfg(photos_wds, rank=rank, world_size=world, num_workers=workers,
                                   key_map={"label": "cls"}))
            ks = keys_of(loader)
            assert len(loader) == loader.stats["batches"]
            assert loader.stats["samples"] == len(ks) == loader.stats["read"]
            for slot, opened in loader.stats["shards_opened"].items():
                assert len(opened) == len(set(opened))
            seen += ks
        assert sorted(seen) == sorted(global_order), (world, workers)


def _spawn_rank(rank, world, folder, out_dir):
    loader = WdsLoader(cfg(folder, rank=rank, world_size=world, num_workers=2, key_map={"label": "cls"},
                           start_index=3))
    (Path(out_dir) / f"{rank}.json").write_text(json.dumps(keys_of(loader)))


@pytest.mark.slow
def test_real_processes_two_ranks_two_workers(photos_wds, global_order, tmp_path):
    tmp_mp.spawn(_spawn_rank, args=(2, str(photos_wds), str(tmp_path)), nprocs=2, join=True)
    per_rank = [json.loads((tmp_path / f"{r}.json").read_text()) for r in range(2)]
    assert not set(per_rank[0]) & set(per_rank[1])
    assert sorted(per_rank[0] + per_rank[1]) == sorted(global_order[3:])


def test_fewer_shards_than_workers_and_empty_slots(tmp_path, caplog):
    folder = write_tar_folder(tmp_path / "small", [
        [(f"s{i}", {"cls": str(i).encode()}) for i in range(4)],
        [(f"t{i}", {"cls": str(i).encode()}) for i in range(3)]])
    all_keys = [f"s{i}" for i in range(4)] + [f"t{i}" for i in range(3)]
    seen = []
    for rank in range(2):  # 2 shards, 7 samples, 6 rank-workers
        seen += keys_of(WdsLoader(WdsLoaderConfig(shards=folder, key_map={"c": "cls"}, deterministic=True,
                                                  rank=rank, world_size=2, num_workers=3, partial=True)))
    assert sorted(seen) == sorted(all_keys)
    # 7 samples for 12 rank-workers: empty ones are reported, a rank with none refuses to start
    c = WdsLoaderConfig(shards=folder, key_map={"c": "cls"}, deterministic=True, rank=2, world_size=4,
                        num_workers=3)
    with caplog.at_level(logging.WARNING):
        loader = WdsLoader(c)
    assert "rank 2: 2 of its 3 worker(s) get no sample: 2 shards, 7 samples for 12 rank-workers" in caplog.text
    assert [e[:2] for e in loader.empty_slots()] == [(2, 1), (2, 2), (3, 0), (3, 1), (3, 2)]
    with pytest.raises(ValueError, match="rank 3 gets no sample.*2 shards, 7 samples for 12 rank-workers"):
        WdsLoader(c.model_copy(update={"rank": 3}))
    assert keys_of(WdsLoader(c.model_copy(update={"rank": 3, "allow_empty_rank": True}))) == []


def test_ignore_index(photos_wds, global_order, tmp_path):
    folder = tmp_path / "wds"
    shutil.copytree(photos_wds, folder)
    victim = global_order[6]
    (folder / IGNORE_INDEX_FILE).write_text(json.dumps({"00001.tar": [victim]}))
    expected = [k for k in global_order if k != victim]
    loader = WdsLoader(cfg(folder, batch_size=1))
    assert len(loader) == 22
    assert keys_of(loader) == expected
    assert loader.stats["read"] == 22
    for world, workers in ((2, 2), (3, 0)):
        seen = []
        for rank in range(world):
            seen += keys_of(WdsLoader(cfg(folder, rank=rank, world_size=world, num_workers=workers)))
        assert sorted(seen) == sorted(expected)
    # resume after the ignored key
    assert keys_of(WdsLoader(cfg(folder, batch_size=1, start_index=8))) == expected[8:]
    # an ignore list naming a key that is not in the shard is refused, not silently mis-split
    (folder / IGNORE_INDEX_FILE).write_text(json.dumps({"00001.tar": ["no_such_key"]}))
    with pytest.raises(RuntimeError, match="stale"):
        keys_of(WdsLoader(cfg(folder, batch_size=1)))


@pytest.mark.parametrize("start", [1, 7, 12, 20, 22])
def test_resume_is_exact_tail(photos_wds, global_order, start):
    loader = WdsLoader(cfg(photos_wds, batch_size=1, start_index=start, key_map={"label": "cls"}))
    assert keys_of(loader) == global_order[start:]
    opened = loader.stats["shards_opened"]["r0w0"]
    assert opened == [f"{i:05d}.tar" for i in range(start // 5, 5)]  # shards before start never opened
    seen = []
    for rank in range(3):
        seen += keys_of(WdsLoader(cfg(photos_wds, rank=rank, world_size=3, num_workers=2, start_index=start,
                                      key_map={"label": "cls"}, allow_empty_rank=True)))
    assert sorted(seen) == sorted(global_order[start:])


class _Evil:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_malicious_pickle_member_raises_and_never_runs(tmp_path):
    marker = Path(f"/tmp/pwned_{uuid.uuid4().hex}")
    evil = io.BytesIO()
    torch.save({"x": _Evil(marker)}, evil)
    good = io.BytesIO()
    torch.save(torch.arange(4.0), good)
    folder = write_tar_folder(tmp_path / "evil", [[
        ("00000", {"latent.pth": evil.getvalue(), "cls": b"1"}),
        ("00001", {"latent.pth": good.getvalue(), "cls": b"2"})]])
    with pytest.raises(dec.MemberDecodeError, match="UnpicklingError|Weights only"):
        dec.decode_member("latent.pth", evil.getvalue())
    loader = WdsLoader(WdsLoaderConfig(shards=folder, key_map={"lat": "latent.pth"}, deterministic=True,
                                       batch_size=1))
    batches = list(loader)
    assert [b["__key__"] for b in batches] == [["00001"]]
    assert torch.equal(batches[0]["lat"], torch.arange(4.0).unsqueeze(0))
    assert loader.stats["dropped"] == {"decode:lat": 1} and "00000.tar/00000" in loader.stats["examples"]["decode:lat"][0]
    with pytest.raises(dec.MemberDecodeError):
        list(WdsLoader(loader.config.model_copy(update={"strict": True})))
    assert not marker.exists()


def test_files_map_relative_as_fastgen_resolves_it_and_missing_file(tmp_path):
    folder = write_tar_folder(tmp_path / "ds", [[(f"k{i}", {"cls": str(i).encode()}) for i in range(3)]])
    emb = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.save(folder / "neg_emb.npy", emb)
    torch.save({"a": torch.ones(2)}, folder / "extra.pth")
    # FastGen joins a relative path to os.path.dirname(<shard folder>): the folder's parent
    loader = WdsLoader(WdsLoaderConfig(shards=folder, key_map={"c": "cls"}, deterministic=True, batch_size=3,
                                       files_map={"neg": "ds/neg_emb.npy", "extra": "ds/extra.pth"}))
    (b,) = list(loader)
    assert b["neg"].shape == (3, 2, 3) and torch.equal(b["neg"][2], torch.from_numpy(emb))
    assert b["extra"]["a"].shape == (3, 2)
    assert b["c"].tolist() == [0, 1, 2]
    with pytest.raises(FileNotFoundError, match=r"files_map\['neg'\].*ds/nope\.npy"):
        WdsLoader(loader.config.model_copy(update={"files_map": {"neg": "ds/nope.npy"}}))
    # the bare name resolves beside the folder, where FastGen looks too; the message says what to write
    with pytest.raises(FileNotFoundError, match=r"files_map\['neg'\].*write 'ds/neg_emb\.npy'"):
        WdsLoader(loader.config.model_copy(update={"files_map": {"neg": "neg_emb.npy"}}))


@pytest.mark.parametrize("workers", [0, 2])
def test_constants_as_views_equal_the_copies_without_copying(tmp_path, workers):
    folder = write_tar_folder(tmp_path / "ds", [[(f"k{i}", {"cls": str(i).encode()}) for i in range(5)],
                                                [(f"m{i}", {"cls": str(i).encode()}) for i in range(4)]])
    emb = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.save(folder / "neg_emb.npy", emb)
    cfg = WdsLoaderConfig(shards=folder, key_map={"c": "cls"}, deterministic=True, batch_size=2, partial=True,
                          num_workers=workers, files_map={"neg": "ds/neg_emb.npy"},
                          presets_map={"empty": "empty_string"})
    copies = list(WdsLoader(cfg))
    loader = WdsLoader(cfg.model_copy(update={"constants_as_views": True}))
    views = list(loader)
    assert [b["__key__"] for b in views] == [b["__key__"] for b in copies] and len(views) == (3 + 2 if workers else 5)
    one = loader.constants["neg"]
    for a, b in zip(copies, views):
        n = len(a["__key__"])
        assert b["neg"].shape == a["neg"].shape == (n, 2, 3) and torch.equal(a["neg"], b["neg"])
        assert b["neg"].data_ptr() == one.data_ptr()  # the one constant tensor, no copy
        if n > 1:
            assert b["neg"].stride()[0] == 0 and a["neg"].stride()[0] == 6  # the default: a real [B, 2, 3] copy
            assert a["neg"].data_ptr() != one.data_ptr()
        assert b["empty"] == a["empty"] == [""] * n


def test_filters_are_counted(tmp_path):
    samples = [("a", {"json": json.dumps({"score": 7}).encode(), "txt": b"fine"}),
               ("b", {"json": json.dumps({"score": 2.5}).encode(), "txt": b"low score"}),
               ("c", {"json": b"{}", "txt": b"no score key"}),
               ("d", {"json": json.dumps({"score": 9}).encode(), "txt": b""}),
               ("e", {"json": json.dumps({"score": 9}).encode()})]
    folder = write_tar_folder(tmp_path / "f", [samples])
    loader = WdsLoader(WdsLoaderConfig(
        shards=folder, key_map={"caption": "txt"}, deterministic=True, batch_size=8, partial=True,
        filters={"score": {"threshold": 5.0}, "empty_keys": {"keys": ["caption"]}},
        presets_map={"neg": "empty_string"}))
    (b,) = list(loader)
    assert b["__key__"] == ["a", "c"] and b["caption"] == ["fine", "no score key"] and b["neg"] == ["", ""]
    st = loader.stats
    assert st["dropped"] == {"filter:score": 1, "filter:empty_keys": 1, "missing:txt": 1}
    assert st["read"] == st["samples"] + sum(st["dropped"].values())


def test_foreign_folder_without_count_file_and_decoder_errors(tmp_path, caplog):
    folder = write_tar_folder(tmp_path / "foreign", [
        [(f"x{i}", {"npy": _npy(i), "npz": _npz(i)}) for i in range(3)],
        [(f"y{i}", {"npy": _npy(i), "npz": _npz(i)}) for i in range(2)]], count_file=False)
    with caplog.at_level(logging.WARNING):
        loader = WdsLoader(WdsLoaderConfig(shards=folder, key_map={"v": "npy", "z": "npz"}, deterministic=True,
                                           batch_size=5, num_workers=2, partial=True))
    assert "no shard_count.json" in caplog.text and "tar headers" in caplog.text
    assert loader.shard_counts == {"00000.tar": 3, "00001.tar": 2}
    keys = []
    for b in loader:
        assert b["v"].dtype == torch.float32 and b["z"]["a"].dtype == torch.int64
        keys += b["__key__"]
    assert sorted(keys) == ["x0", "x1", "x2", "y0", "y1"]
    with pytest.raises(ValueError, match="num_frames"):
        WdsLoaderConfig(shards=folder, key_map={"v": "mp4"})
    with pytest.raises(dec.MemberDecodeError):
        dec.decode_member("txt", b"\xff\xfe bad")


def _npy(i):
    b = io.BytesIO()
    np.save(b, np.full((2,), i, dtype=np.float32))
    return b.getvalue()


def _npz(i):
    b = io.BytesIO()
    np.savez(b, a=np.array([i, i + 1]))
    return b.getvalue()


def test_training_mode_is_seeded_and_infinite(photos_wds, global_order):
    c = cfg(photos_wds, deterministic=False, batch_size=4, shuffle_size=8, seed=5, key_map={"label": "cls"})

    def first(n, conf):
        it = iter(WdsLoader(conf))
        return [next(it)["__key__"] for _ in range(n)]

    a, b = first(12, c), first(12, c)  # 48 samples > 23: it wraps around forever
    assert a == b
    assert set(k for ks in a for k in ks) <= set(global_order)
    assert first(12, c.model_copy(update={"seed": 6})) != a
    with pytest.raises(TypeError):
        len(WdsLoader(c))
    keys = first(6, c.model_copy(update={"num_workers": 2}))
    assert all(len(k) == 4 for k in keys)


def test_optional_packages_missing_give_install_hint(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "safetensors", None)
    monkeypatch.setitem(sys.modules, "safetensors.torch", None)
    monkeypatch.setitem(sys.modules, "soundfile", None)
    with pytest.raises(ValueError, match="pip install safetensors"):
        WdsLoaderConfig(shards=tmp_path, key_map={"v": "latent.safetensors"})
    with pytest.raises(ValueError, match="pip install soundfile"):
        WdsLoaderConfig(shards=tmp_path, key_map={"a": "flac"})
    with pytest.raises(dec.UnsupportedMemberError, match="pip install safetensors"):
        dec.decode_member("safetensors", b"")


def test_safetensors_member_when_installed(tmp_path):
    st = pytest.importorskip("safetensors.torch")
    data = st.save({"lat": torch.ones(2, 3), "mask": torch.zeros(4, dtype=torch.int64)})
    folder = write_tar_folder(tmp_path / "st", [[(f"k{i}", {"latent.safetensors": data}) for i in range(3)]])
    st.save_file({"emb": torch.full((5,), 2.0)}, str(folder / "neg.safetensors"))
    (b,) = list(WdsLoader(WdsLoaderConfig(shards=folder, key_map={"real": "latent.safetensors"}, deterministic=True,
                                          batch_size=3, files_map={"neg": "st/neg.safetensors"})))
    assert b["real"]["lat"].shape == (3, 2, 3) and b["real"]["mask"].dtype == torch.int64
    assert torch.equal(b["neg"], torch.full((3, 5), 2.0))


# ----------------------------------------------------------------------------- fast tar header reader

def _tarfile_listing(path):
    with tarfile.open(path, "r:") as tf:
        return [(i.name, i.offset_data, i.size) for i in tf if i.isfile()]


def _tarfile_samples(path):
    """Reference grouping, independent of the loader's: tarfile listing + webdataset's key rule."""
    from shardsmith import formats

    out, key = [], None
    with tarfile.open(path, "r:") as tf:
        for i in tf:
            parts = formats.split_member(i.name) if i.isfile() else None
            if parts is None:
                continue
            if parts[0] != key:
                key = parts[0]
                out.append((key, {}))
            out[-1][1][parts[1]] = (i.offset_data, i.size)
    return out


def _odd_members(seed=0):
    """Names and sizes that exercise the header reader: long and non-ASCII names (pax path /
    GNU longname / ustar prefix), sizes at block boundaries, empty members."""
    import random

    rnd = random.Random(seed)
    out = []
    for i in range(40):
        if i % 5 == 4:
            key = "sub/" + "x" * rnd.choice([5, 95, 140, 300]) + f"_é{i}"
        else:
            key = f"k{i:04d}"
        for suffix in ("jpg", "txt", "latent.pth"):
            out.append((f"{key}.{suffix}", bytes(rnd.getrandbits(8) for _ in range(rnd.choice([0, 1, 511, 512, 513, 2000])))))
    return out


def _write_format(path, members, fmt):
    with tarfile.open(path, "w", format=fmt) as tf:
        d = tarfile.TarInfo("somedir")
        d.type = tarfile.DIRTYPE
        tf.addfile(d)
        ln = tarfile.TarInfo("a_link")
        ln.type = tarfile.SYMTYPE
        ln.linkname = "t" * (200 if fmt != tarfile.USTAR_FORMAT else 10)
        tf.addfile(ln)
        for name, data in members:
            if fmt == tarfile.USTAR_FORMAT and len(name.encode()) > 100:
                name = "p" * 60 + "/" + name.rsplit("/", 1)[-1][-90:]  # fits as ustar prefix + name
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            ti.mtime = 1234567890.25 if fmt == tarfile.PAX_FORMAT else 1234567890
            tf.addfile(ti, io.BytesIO(data))


def test_fast_tar_reader_matches_tarfile(tmp_path):
    import webdataset as wds_mod

    from shardsmith.formats import tar as T
    from shardsmith.loaders import shard_reader as W
    from shardsmith.sinks.tar import DeterministicTar

    members = _odd_members()
    paths = []
    with open(tmp_path / "shardsmith.tar", "wb") as f:  # what shardsmith's sink writes (PAX)
        t = DeterministicTar(f)
        for name, data in members:
            t.add(name, data)
        t.close()
    paths.append(tmp_path / "shardsmith.tar")
    for fmt, name in ((tarfile.GNU_FORMAT, "gnu.tar"), (tarfile.PAX_FORMAT, "pax.tar"),
                      (tarfile.USTAR_FORMAT, "ustar.tar")):
        _write_format(tmp_path / name, members, fmt)
        paths.append(tmp_path / name)
    with wds_mod.TarWriter(str(tmp_path / "webdataset.tar")) as w:  # pax mtime records on every member
        for i in range(30):
            w.write({"__key__": f"s{i:04d}", "latent.pth": bytes(range(256)) * (i % 7), "txt": b"hi" * i})
    paths.append(tmp_path / "webdataset.tar")
    for p in paths:
        ref = _tarfile_listing(p)
        fd = os.open(p, os.O_RDONLY)
        try:
            assert T._scan_fast(fd, os.fstat(fd).st_size) == ref, p.name  # no tarfile fallback needed
        finally:
            os.close(fd)
        assert T.tar_members(p) == ref
        assert W.shard_samples(p) == _tarfile_samples(p), p.name
        assert W.count_tar_samples(p) == len(_tarfile_samples(p))
    # the member bytes read at the listed offsets are the members
    fd = os.open(paths[0], os.O_RDONLY)
    try:
        got = [(n, W.read_member(fd, (o, s))) for n, o, s in T.tar_members(paths[0])]
    finally:
        os.close(fd)
    assert got == members


def test_fast_tar_reader_broken_shards_behave_like_tarfile(tmp_path):
    from shardsmith.formats import tar as T
    from shardsmith.sinks.tar import DeterministicTar

    with open(tmp_path / "good.tar", "wb") as f:
        t = DeterministicTar(f)
        for name, data in _odd_members(1):
            t.add(name, data)
        t.close()
    data = (tmp_path / "good.tar").read_bytes()

    def outcome(fn, p):
        try:
            return "ok", fn(p)
        except Exception as e:  # noqa: BLE001
            return "error", type(e).__name__

    variants = {f"cut{c}": data[:c] for c in (0, 100, 512, 700, 1536, len(data) // 3, len(data) // 2,
                                               len(data) - 1024, len(data) - 10)}
    for pos in (148, 600, 1024 + 130, len(data) // 2):  # garbled checksum, header or data bytes
        g = bytearray(data)
        g[pos] ^= 0x5A
        variants[f"garbled{pos}"] = bytes(g)
    v7 = bytearray(data[:512 * 4])  # no ustar magic: left to tarfile
    v7[257:265] = bytes(8)
    variants["v7"] = bytes(v7)
    for name, blob in variants.items():
        p = tmp_path / f"{name}.tar"
        p.write_bytes(blob)
        assert outcome(T.tar_members, p) == outcome(_tarfile_listing, p), name


def test_training_decodes_only_what_it_delivers(photos_wds, global_order, monkeypatch):
    """Training buffers raw bytes: nothing is decoded before a sample leaves the shuffle buffer,
    so the first batch costs ~batch_size decodes, not a whole buffer's worth."""
    calls = []
    real = dec.decode_member

    def counting(suffix, data, **kw):
        calls.append(suffix)
        return real(suffix, data, **kw)

    monkeypatch.setattr(dec, "decode_member", counting)
    c = cfg(photos_wds, deterministic=False, batch_size=4, shuffle_size=1000, seed=3,
            key_map={"label": "cls", "caption": "txt"})
    loader = WdsLoader(c)
    it = iter(loader)
    first = [next(it) for _ in range(3)]
    assert len(calls) == 3 * 4 * 2  # 12 samples x 2 members, none decoded in advance
    assert all(len(b["__key__"]) == 4 for b in first)
    assert set(k for b in first for k in b["__key__"]) <= set(global_order)
    # reproducible, and the order differs from the file order
    again = iter(WdsLoader(c))
    assert [next(again)["__key__"] for _ in range(3)] == [b["__key__"] for b in first]
    assert [k for b in first for k in b["__key__"]] != global_order[:12]


def test_training_counts_drops_when_samples_leave_the_buffer(tmp_path):
    samples = [(f"s{i:02d}", {"json": json.dumps({"score": i % 4}).encode(), "txt": b"t" if i % 5 else b""})
               for i in range(20)]
    folder = write_tar_folder(tmp_path / "tf", [samples[:10], samples[10:]])
    loader = WdsLoader(WdsLoaderConfig(
        shards=folder, key_map={"caption": "txt"}, deterministic=False, batch_size=2, shuffle_size=30,
        filters={"score": {"threshold": 2}, "empty_keys": {"keys": ["caption"]}}))
    n = 0
    for b in loader:
        for k in b["__key__"]:
            i = int(k[1:])
            assert i % 4 >= 2 and i % 5
        n += 1
        if n == 40:
            break
    st = loader.stats
    assert set(st["dropped"]) <= {"filter:score", "filter:empty_keys"} and st["dropped"]
    # read counts samples taken from the shards: delivered + dropped + still in the buffers
    assert st["read"] >= st["samples"] + sum(st["dropped"].values())
    # a key_map no sample satisfies raises instead of spinning forever
    bad = WdsLoader(loader.config.model_copy(update={"key_map": {"x": "npy"}, "filters": {}}))
    with pytest.raises(RuntimeError, match="none passed"):
        next(iter(bad))


def test_stats_records_are_not_sent_before_every_batch(photos_wds):
    from shardsmith.loaders import wds_dataset as W

    loader = WdsLoader(cfg(photos_wds, batch_size=1, key_map={"label": "cls"}))
    items = list(loader.dataset)  # num_workers=0: the dataset's own stream
    stats = [it["__stats__"] for it in items if "__stats__" in it]
    batches = [it for it in items if "__stats__" not in it]
    assert len(batches) == 23
    assert 1 <= len(stats) <= 1 + 23 // W.STATS_EVERY_BATCHES + 1  # (a slow machine may add a timed one)
    assert sum(s["read"] for s in stats) == 23
    assert "__stats__" in items[-1]  # the pass ends with the remaining counters
    list(loader)
    assert loader.stats["read"] == loader.stats["samples"] == 23 and loader.stats["batches"] == 23


def test_a_shard_is_listed_once_per_process_tree_and_again_when_it_changes(tmp_path, monkeypatch):
    """Deterministic mode splits by sample: every worker reads every shard. The rank lists each
    shard's headers once; forked workers (and the next pass) reuse the listing; a rewritten shard
    is listed again."""
    import shardsmith.loaders.shard_reader as W

    monkeypatch.setattr(W, "_INDEX", W._MemberIndex())
    log = tmp_path / "listed.txt"
    real = W.tar_members

    def counting(path, fd=None):
        with open(log, "a") as f:
            f.write(f"{os.getpid()} {Path(path).name}\n")
        return real(path, fd)

    monkeypatch.setattr(W, "tar_members", counting)
    folder = write_tar_folder(tmp_path / "ds", [[(f"s{j}k{i}", {"cls": str(i).encode()}) for i in range(6)]
                                                for j in range(3)])
    cfg = WdsLoaderConfig(shards=folder, key_map={"c": "cls"}, deterministic=True, batch_size=2, num_workers=3,
                          partial=True)
    for _ in range(2):  # two passes
        batches = list(WdsLoader(cfg))
        assert sum(len(b["__key__"]) for b in batches) == 18
    lines = log.read_text().split()
    assert sorted(lines[1::2]) == ["00000.tar", "00001.tar", "00002.tar"]  # once each, for both passes
    assert set(lines[0::2]) == {str(os.getpid())}  # by this process, never by a worker
    # a rewritten shard is listed again, with its new content
    write_tar_folder(tmp_path / "ds", [[(f"s{j}k{i}", {"cls": str(i).encode()}) for i in range(6 if j else 4)]
                                       for j in range(3)])
    assert sum(len(b["__key__"]) for b in WdsLoader(cfg)) == 16
    assert log.read_text().split()[1::2].count("00000.tar") == 2
