"""verify / inspect / repair / register from the command line, over real processes."""

import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch
import webdataset as wds

from media_factory import real_photos
from shardsmith.build import build
from shardsmith.recipe import recipe_from_dict

PY = sys.executable


def cli(*args, env=None):
    return subprocess.run([PY, "-m", "shardsmith", *map(str, args)], capture_output=True, text=True,
                          env={**os.environ, **(env or {})})


@pytest.fixture(scope="module")
def photos_wds(tmp_path_factory):
    root = tmp_path_factory.mktemp("vphotos")
    paths = real_photos(root / "src", 10, seed=21, min_side=40, max_side=90)
    for p in paths:
        p.with_suffix(".txt").write_text(f"a photo called {p.stem}")
    build(recipe_from_dict({"sources": [{"path": str(root / "src")}],
                            "outputs": [{"format": "wds", "samples_per_shard": 4}]}), root / "out", quiet=True)
    return root / "out" / "wds"


@pytest.fixture(scope="module")
def latent_wds(tmp_path_factory):
    """A latent dataset written by plain webdataset (not shardsmith), uneven shards."""
    root = tmp_path_factory.mktemp("vlatent") / "lat"
    root.mkdir()
    g = torch.Generator().manual_seed(0)
    n = 0
    for shard, size in enumerate([7, 7, 3]):
        with wds.TarWriter(str(root / f"{shard:05d}.tar")) as w:
            for _ in range(size):
                buf, emb = io.BytesIO(), io.BytesIO()
                torch.save(torch.randn(4, 8, 8, generator=g), buf)
                torch.save(torch.randn(16, 32, generator=g).to(torch.bfloat16), emb)
                w.write({"__key__": f"s{n:04d}", "latent.pth": buf.getvalue(), "txt_emb.pth": emb.getvalue()})
                n += 1
    np.save(root / "neg_prompt_emb.npy", np.zeros((16, 32), dtype=np.float32))
    (root / "shard_count.json").write_text(json.dumps({"00000.tar": 7, "00001.tar": 7, "00002.tar": 3}))
    (root / "ignore_index.json").write_text(json.dumps({"00001.tar": ["s0009"]}))
    return root


def _copy_with_nan_shard(src, bad):
    """A copy of ``src`` whose last shard holds 3 samples with an all-NaN latent."""
    bad.mkdir()
    for p in src.iterdir():
        (bad / p.name).write_bytes(p.read_bytes())
    buf = io.BytesIO()
    torch.save(torch.full((4, 8, 8), float("nan")), buf)
    with wds.TarWriter(str(bad / "00002.tar")) as w:
        for i in range(3):
            emb = io.BytesIO()
            torch.save(torch.zeros(16, 32), emb)
            w.write({"__key__": f"t{i}", "latent.pth": buf.getvalue(), "txt_emb.pth": emb.getvalue()})
    return bad


@pytest.mark.slow
def test_verify_reports_coverage_contract_and_empty_worker_splits(photos_wds, tmp_path):
    out = tmp_path / "rep.json"
    r = cli("verify", photos_wds, "--world", "2", "--workers", "2", "--batch-size", "3", "--out-json", out)
    rep = json.loads(out.read_text())
    assert rep == json.loads(json.dumps(rep))
    checks = {c["name"]: c for c in rep["checks"]}
    assert rep["key_map"] == {"jpg": "jpg", "txt": "txt", "json": "json"}
    assert checks["coverage"]["ok"] and rep["coverage"]["unique"] == 10 and not rep["coverage"]["duplicates"]
    assert checks["shard_count"]["ok"] and checks["manifest"]["ok"] and checks["no_drops"]["ok"]
    # 3 shards for 2 ranks x 2 workers: our loader splits by sample (no empty worker), but FastGen's
    # validation mode splits by shard and one worker there would raise: verify says so and what to change
    assert checks["empty_splits"]["ok"] and rep["fastgen_validation_empty"] == 1
    assert r.returncode == 0 and "warning: 3 shards for 4 rank-workers" in r.stdout and "at least 4 shards" in r.stdout
    r = cli("verify", photos_wds, "--world", "2", "--workers", "6", "--json")  # 12 rank-workers, 10 samples
    rep = json.loads(r.stdout)
    checks = {c["name"]: c for c in rep["checks"]}
    assert r.returncode == 1 and not checks["empty_splits"]["ok"]
    assert "10 samples for 12 rank-workers" in checks["empty_splits"]["detail"]
    assert checks["coverage"]["ok"]
    txt = rep["contract"]["keys"]["txt"]
    assert txt["type"] == "str" and txt["empty"] == 0 and txt["samples"] == 10
    r = cli("verify", photos_wds, "--world", "1", "--workers", "3", "--image-size", "32", "--json")
    rep = json.loads(r.stdout)
    assert r.returncode == 0 and rep["ok"], rep["checks"]
    jpg = rep["contract"]["keys"]["jpg"]
    assert jpg["shape"] == [3, 32, 32] and jpg["dtype"] == "float32" and -1 <= jpg["min"] and jpg["max"] <= 1


@pytest.mark.slow
def test_verify_latents_with_preset_ignore_index_and_nan(latent_wds):
    r = cli("verify", latent_wds, "--preset", "image_latent", "--world", "3", "--workers", "1", "--json")
    rep = json.loads(r.stdout)
    assert r.returncode == 0 and rep["ok"], rep["checks"]
    assert rep["coverage"]["unique"] == 16 and "00001.tar/s0009" not in str(rep["coverage"])
    keys = rep["contract"]["keys"]
    assert keys["real"]["shape"] == [4, 8, 8] and keys["real"]["dtype"] == "float32"
    assert keys["condition"]["shape"] == [16, 32] and keys["condition"]["dtype"] == "bfloat16"
    assert keys["neg_condition"]["max"] == 0
    # a NaN latent is caught
    bad = _copy_with_nan_shard(latent_wds, latent_wds.parent / "bad")
    r = cli("verify", bad, "--preset", "image_latent", "--world", "1", "--workers", "0")
    assert r.returncode == 1 and "[FAIL] finite:real" in r.stdout and "NaN" in r.stdout


@pytest.mark.slow
def test_inspect_and_repair_cli_on_a_truncated_shard(photos_wds, tmp_path):
    d = tmp_path / "w"
    d.mkdir()
    for p in photos_wds.iterdir():
        (d / p.name).write_bytes(p.read_bytes())
    data = (d / "00001.tar").read_bytes()
    (d / "00001.tar").write_bytes(data[: len(data) * 2 // 3])
    r = cli("inspect", d, "--workers", "2")
    assert r.returncode == 1 and "00001.tar" in r.stdout and "truncat" in r.stdout.lower()
    r = cli("repair", d, "--json")
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    shard = rep["shards"]["00001.tar"]
    assert shard["action"] == "rewritten" and (d / "00001.tar.orig").read_bytes() == data[: len(data) * 2 // 3]
    counts = json.loads((d / "shard_count.json").read_text())
    assert counts["00001.tar"] == shard["samples_after"] == len(list(wds.WebDataset(str(d / "00001.tar"),
                                                                                     shardshuffle=False)))
    assert cli("inspect", d).returncode == 0


@pytest.mark.slow
def test_register_then_from_config_builds_the_loader(photos_wds, tmp_path):
    cfg = tmp_path / "data.yaml"
    env = {"DATA_ROOT_DIR": str(photos_wds.parent.parent)}
    r = cli("register", photos_wds, "--preset", "image", "--name", "tiny", "--config", cfg,
            "--set", "image_size=32", "--set", "batch_size=5", env=env)
    assert r.returncode == 0, r.stderr
    entry = __import__("yaml").safe_load(cfg.read_text())["tiny"]
    assert entry == {"preset": "image", "path": "${DATA_ROOT_DIR}/out/wds",
                     "overrides": {"image_size": 32, "batch_size": 5}}
    assert 'datatags = ["WDS:" + os.path.join(os.environ["DATA_ROOT_DIR"], \'out/wds\')]' in r.stdout
    assert "shard_count_file" in r.stdout and "sampler_start_idx = None" in r.stdout
    assert "TINY_Loader_Config.input_res = 32" in r.stdout and "image_size" not in r.stdout  # FastGen's name
    # a different entry under the same name is refused; the file keeps the first one
    r2 = cli("register", photos_wds, "--preset", "image", "--name", "tiny", "--config", cfg, env=env)  # no --set
    assert r2.returncode == 2 and "already has a different entry" in r2.stderr
    from shardsmith.loaders import from_config

    os.environ["DATA_ROOT_DIR"] = env["DATA_ROOT_DIR"]
    try:
        loader = from_config("tiny", cfg, deterministic=True, num_workers=0)
        batches = list(loader)
    finally:
        del os.environ["DATA_ROOT_DIR"]
    assert sum(len(b["__key__"]) for b in batches) == 10
    assert batches[0]["real"].shape == (5, 3, 32, 32) and batches[0]["condition"][0].startswith("a photo called")
    assert batches[0]["neg_condition"] == [""] * 5
    with pytest.raises(ValueError, match="not set"):
        from_config("tiny", cfg)


def test_fastgen_snippet_uses_fastgen_field_names_and_axis_orders():
    from shardsmith.loaders.fastgen import fastgen_fields

    assert fastgen_fields({"num_frames": 81, "video_size": [480, 832], "batch_size": 2}) == \
        {"sequence_length": 81, "img_size": (832, 480), "batch_size": 2}  # VideoWDSLoader.img_size is (W, H)
    assert fastgen_fields({"image_size": 512}) == {"input_res": 512}


def test_contract_stats_computed_on_tensors_match_a_float64_reference():
    from shardsmith.verify.contract import ContractRecorder

    g = torch.Generator().manual_seed(1)
    rec = ContractRecorder()
    xs = []
    for i in range(4):
        x = torch.randn(6, 3, 5, generator=g) * (i + 1)
        if i == 1:
            x[0, 0, 0], x[2, 1, 1], x[3, 2, 2] = float("nan"), float("inf"), -float("inf")
        xs.append(x)
        rec.add({"__key__": [str(j) for j in range(6)], "bf": x.to(torch.bfloat16), "f": x,
                 "lab": torch.arange(6) + i, "flag": torch.arange(6) % 2 == 0,
                 "per_sample": [torch.full((i + 1,), float(j)) for j in range(6)], "np": np.arange(6.0) - i})
    c = rec.to_dict()
    assert c["batches"] == 4 and c["samples"] == 24
    for key, cast in (("bf", lambda t: t.to(torch.bfloat16)), ("f", lambda t: t)):
        a = torch.cat([cast(x).double().reshape(-1) for x in xs])
        fin = a[torch.isfinite(a)]
        st = c["keys"][key]
        assert st["nan"] == 1 and st["inf"] == 2 and st["shape"] == [3, 5] and st["samples"] == 24
        assert st["min"] == fin.min().item() and st["max"] == fin.max().item()
        # sums accumulate in float32; a bf16 batch's sum comes back rounded to bf16 (~3 digits)
        scale = fin.abs().mean().item()
        assert st["mean"] == pytest.approx(fin.mean().item(), abs=(1e-6 if key == "f" else 1e-2) * scale)
    assert c["keys"]["bf"]["dtype"] == "bfloat16"
    lab = c["keys"]["lab"]
    assert (lab["min"], lab["max"], lab["mean"]) == (0.0, 8.0, 4.0) and lab["examples"] == [0, 1, 2]
    assert c["keys"]["flag"]["examples"] == [True, False, True] and c["keys"]["flag"]["mean"] == 0.5
    ps = c["keys"]["per_sample"]
    assert ps["samples"] == 24 and len(ps["shapes"]) == 4 and ps["max"] == 5.0
    assert c["keys"]["np"]["min"] == -3.0 and c["keys"]["np"]["max"] == 5.0


def test_verify_gnu_longname_shards_and_expected_list(tmp_path):
    """Shards the fast header reader parses (GNU longnames, dirs) give the same expected list as
    tarfile, and verify covers them."""
    from shardsmith.verify.accounting import expected_wds as _expected_wds
    from shardsmith.verify.runner import verify

    root = tmp_path / "gnu"
    root.mkdir()
    counts = {}
    n = 0
    for shard in range(2):
        name = f"{shard:05d}.tar"
        with tarfile.open(root / name, "w", format=tarfile.GNU_FORMAT) as tf:
            d = tarfile.TarInfo("dir")
            d.type = tarfile.DIRTYPE
            tf.addfile(d)
            for i in range(5):
                key = f"deep/{'k' * 120}{n:03d}"
                for suffix, data in (("cls", str(n % 3).encode()), ("txt", f"caption {n}".encode())):
                    ti = tarfile.TarInfo(f"{key}.{suffix}")
                    ti.size = len(data)
                    tf.addfile(ti, io.BytesIO(data))
                n += 1
        counts[name] = 5
    (root / "shard_count.json").write_text(json.dumps(counts))
    ids, _, _ = _expected_wds(root)
    ref = []
    for name in sorted(counts):
        with tarfile.open(root / name) as tf:
            ref += list(dict.fromkeys(f"{name}/{i.name.split('.')[0]}" for i in tf if i.isfile()))
    assert ids == ref and len(ids) == 10
    rep = verify(root, key_map={"label": "cls", "caption": "txt"}, world=2, workers=1, batch_size=3)
    checks = {c["name"]: c for c in rep["checks"]}
    assert rep["ok"], rep["checks"]
    assert checks["coverage"]["ok"] and rep["coverage"]["unique"] == 10


def test_contract_reads_a_loader_constant_from_its_first_row_but_counts_every_sample():
    from shardsmith.verify.contract import ContractRecorder

    neg = torch.linspace(-2, 3, 12).reshape(3, 4)
    full, const = ContractRecorder(), ContractRecorder()
    for _ in range(3):
        batch = {"__key__": list("abcde"), "neg_condition": neg.expand(5, 3, 4).contiguous()}
        full.add(batch)
        const.add(batch, constant_keys={"neg_condition"})
    a, b = full.to_dict()["keys"]["neg_condition"], const.to_dict()["keys"]["neg_condition"]
    assert b["samples"] == a["samples"] == 15 and b["shape"] == a["shape"] == [3, 4]
    assert (b["min"], b["max"]) == (a["min"], a["max"]) == (-2.0, 3.0)
    assert b["mean"] == pytest.approx(a["mean"], abs=1e-6)


@pytest.mark.slow
def test_contract_recorded_in_the_workers_equals_the_rank_side_contract(latent_wds, tmp_path):
    from shardsmith.verify.runner import verify

    reps = {m: verify(latent_wds, preset="image_latent", world=2, workers=2, batch_size=3, contract_in=m)
            for m in ("rank", "workers", "workers-only")}
    for m, rep in reps.items():
        assert rep["ok"], (m, rep["checks"])
        assert rep["contract_in"] == m and rep["coverage"]["unique"] == rep["coverage"]["seen"] == 16
    a = reps["rank"]["contract"]
    for m in ("workers", "workers-only"):
        b = reps[m]["contract"]
        assert (a["batches"], a["samples"], a["batch_sizes"]) == (b["batches"], b["samples"], b["batch_sizes"])
        assert a["keys"].keys() == b["keys"].keys() == {"real", "condition", "neg_condition"}
        for k in a["keys"]:
            x, y = dict(a["keys"][k]), dict(b["keys"][k])
            assert x.pop("mean") == pytest.approx(y.pop("mean"), rel=1e-6, abs=1e-9)
            assert x == y, (m, k)
    # the default: batches reach the ranks, which check every one and re-read the first of each rank in full
    checks = {c["name"]: c for c in reps["workers"]["checks"]}
    assert checks["rank_batches"]["ok"] and checks["rank_batches"]["detail"].startswith(
        f"{a['batches']} batches reached their rank with the keys, dtypes and shapes the workers collated; 2 re-read")
    assert "rank_batches" not in {c["name"] for m in ("rank", "workers-only") for c in reps[m]["checks"]}
    # auto (the default): in the workers with 4+ of them per rank; with fewer, in the rank
    auto = verify(latent_wds, preset="image_latent", world=1, workers=4, batch_size=3)
    assert auto["ok"] and auto["contract_in"] == "workers"
    assert auto["coverage"]["unique"] == auto["contract"]["samples"] == 16
    assert {c["name"] for c in auto["checks"]} >= {"rank_batches", "coverage"}
    assert verify(latent_wds, preset="image_latent", world=2, workers=3, batch_size=3)["contract_in"] == "rank"
    # a NaN is still caught when the workers record the contract, and the text says where it was recorded
    bad = _copy_with_nan_shard(latent_wds, tmp_path / "bad")
    for mode, where in (("workers", "(batches sent to the ranks)"), ("workers-only", "(batches not sent to the ranks)")):
        r = cli("verify", bad, "--preset", "image_latent", "--world", "2", "--workers", "2", "--contract-in", mode)
        assert r.returncode == 1 and "[FAIL] finite:real" in r.stdout, r.stdout
        assert f"contract recorded in the workers {where}" in r.stdout
    r = cli("verify", bad, "--contract-in", "gpu")
    assert r.returncode != 0 and "contract_in must be one of 'auto', 'workers', 'rank', 'workers-only'" in (r.stdout + r.stderr)


@pytest.mark.parametrize("damage", ["value", "shape"])
def test_a_batch_changed_between_worker_and_rank_fails_verify(latent_wds, monkeypatch, damage):
    """With the contract recorded in the workers, the rank still checks what it received: a batch
    whose shapes differ from what the worker collated fails at once; one whose values differ fails
    when the rank re-reads it (its first batch is always re-read)."""
    from shardsmith.loaders.wds import WdsLoader
    from shardsmith.verify.runner import verify

    real_iter = WdsLoader.__iter__

    def damaged(self):  # the ranks are forked: they run this
        for i, batch in enumerate(real_iter(self)):
            if i == 0 and damage == "value":
                batch["real"] = batch["real"].clone()
                batch["real"][0, 0, 0, 0] += 1.0
            elif i == 0:
                batch["real"] = batch["real"][:, :2]
            yield batch

    monkeypatch.setattr(WdsLoader, "__iter__", damaged)
    rep = verify(latent_wds, preset="image_latent", world=2, workers=2, batch_size=3, contract_in="workers")
    assert not rep["ok"]
    check = {c["name"]: c for c in rep["checks"]}["rank_batches"]
    assert not check["ok"] and check["detail"].startswith("2 batch(es) changed between the worker and the rank: batch 0 (")
    if damage == "value":
        assert "the values the rank got differ from those the worker recorded" in check["detail"]
    else:
        assert "the rank got [('Tensor', 'float32', (3, 2, 8, 8))] for ['real'], the worker collated " \
               "[('Tensor', 'float32', (3, 4, 8, 8))]" in check["detail"]


@pytest.mark.slow
def test_coverage_is_linear_and_exact_on_a_million_ids():
    """verify's coverage step at dataset scale: the quadratic version took 17 s at 20k samples
    (hours at 1M); this one is a few set operations."""
    import time

    from shardsmith.verify.accounting import coverage

    expected = [f"{i // 1000:05d}.tar/{i:08d}" for i in range(1_000_000)]
    ranks = [expected[0::3], expected[1::3], expected[2::3]]
    ranks[0] = ranks[0][:-1] + [expected[5], "99999.tar/stray"]  # one missing, one twice, one unknown
    t = time.perf_counter()
    cov = coverage(expected, ranks, full=True)
    assert time.perf_counter() - t < 10
    assert cov["expected"] == 1_000_000 and cov["seen"] == 1_000_001 and cov["unique"] == 1_000_000
    assert cov["duplicates"] == [expected[5]] and cov["missing"] == [expected[0::3][-1]]
    assert cov["unknown"] == ["99999.tar/stray"]
    assert coverage(expected, ranks, full=False)["missing"] == []
