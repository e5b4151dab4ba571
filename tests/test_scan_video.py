"""``shardsmith scan`` on real clips and audio (issue 16): video / audio histograms, which clip fits
which bucket (compared with what a build of the same recipe writes), the latent size estimated from
the buckets and the VAE's compression factors (within 2 % of the build's bytes), the sample a
large folder is cut to, the CLI and ``--json``."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest
import yaml
from rich.console import Console
from typer.testing import CliRunner

from media_factory import real_photos
from shardsmith.build import build
from shardsmith.cli import app
from shardsmith.progress import Progress
from shardsmith.recipe import recipe_from_dict
from shardsmith.scan import format_scan, scan
from video_factory import audio_only_file, pan_video

BUCKETS = ["64x64x1", "64x64x9", "96x64x17"]
#: clip -> (frames, fps, size, bucket a build puts it in, or None when too short)
CLIPS = {
    "long.mp4": (20, 24, (96, 64), "96x64x17"),
    "mid.mp4": (12, 24, (64, 64), "64x64x9"),  # with an audio track
    "wide.mp4": (25, 25, (128, 64), "96x64x17"),
    "tall.mp4": (30, 15, (64, 96), "64x64x9"),
    "short.mp4": (5, 24, (64, 64), None),
}


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("scanvideo") / "media"
    root.mkdir()
    for name, (frames, fps, size, _) in CLIPS.items():
        pan_video(root / name, frames=frames, fps=fps, size=size, audio="tone" if name == "mid.mp4" else None)
    audio_only_file(root / "tone.m4a", duration=1.0, rate=22050)
    photo = real_photos(root, 1, seed=3, min_side=70, max_side=100)[0]
    for p in root.iterdir():
        p.with_suffix(".txt").write_text(f"caption of {p.stem}", encoding="utf-8")
    assert photo.exists()
    return root


def _recipe_dict(folder: Path) -> dict:
    return {"sources": [{"path": str(folder), "license": "cc-by-4.0"}],
            "geometry": {"buckets": BUCKETS},
            "models": {"vae": {"family": "ltx"}, "text": {"family": "minilm"}},
            "outputs": [{"format": "precomputed"},
                        {"format": "latent_wds", "dir": "lat", "samples_per_shard": 2}]}


@pytest.fixture(scope="module")
def report(folder):
    return scan(recipe_from_dict(_recipe_dict(folder)))


def test_video_and_audio_histograms_count_every_clip(report):
    v = report["videos"]
    assert v["count"] == 5 and v["unreadable"] == 0 and v["sampled_out"] == 0
    assert {k: n for k, n in v["frames"].items() if n} == {"<9": 1, "9-16": 1, "17-32": 3}
    assert v["fps"] == {"24": 3, "15": 1, "25": 1}
    assert v["resolution"] == {"64x64": 2, "128x64": 1, "64x96": 1, "96x64": 1}
    assert sum(v["duration"].values()) == 5 and v["duration"]["2-5s"] == 1  # tall: 30 frames at 15 fps
    assert v["frames_stats"] == {"min": 5, "median": 20, "max": 30}
    assert v["with_audio"] == 1
    a = report["audio"]
    assert (a["count"], a["files"], a["tracks"]) == (2, 1, 1)
    assert a["sample_rate"] == {"16000": 1, "22050": 1} and a["channels"] == {"2": 2}
    assert sum(a["duration"].values()) == 2
    text = format_scan(report)
    for line in ("videos (5 probed, 0 unreadable)", "audio (1 file(s), 1 clip track(s)", "64x96", "22050"):
        assert line in text


def test_each_clip_is_fitted_to_the_bucket_the_build_would_pick(report):
    b = report["buckets"]
    want = {}
    for name, (*_, bucket) in CLIPS.items():
        if bucket:
            want.setdefault(bucket, set()).add(f"media/{name}")
    got = {k: set(x["items"]) - {i for i in x["items"] if i.endswith(".jpg") or i.endswith(".png")}
           for k, x in b["buckets"].items()}
    assert {k: v for k, v in got.items() if v} == want
    assert b["buckets"]["64x64x1"]["images"] == 1 and b["buckets"]["64x64x1"]["videos"] == 0
    assert list(b["skipped"]) == ["skipped:too_short"]
    assert b["skipped"]["skipped:too_short"]["items"] == ["media/short.mp4"]
    assert "5 frames" in b["skipped"]["skipped:too_short"]["detail"]
    assert report["usable"] == 5  # 4 clips + 1 photo fit; the short clip and the audio file do not
    text = format_scan(report)
    assert "skipped:too_short: 1: media/short.mp4" in text and "64x64x9" in text


def _written_buckets(lat: Path) -> dict[str, set[str]]:
    """bucket -> item ids, read from the json members of a built multi-bucket latent_wds output."""
    out: dict[str, set[str]] = {}
    for tar in sorted(lat.glob("*/*.tar")):
        with tarfile.open(tar) as t:
            for m in t.getmembers():
                if m.name.endswith(".json"):
                    meta = json.loads(t.extractfile(m).read())
                    out.setdefault(tar.parent.name, set()).add(meta["id"])
    return out


@pytest.mark.slow
def test_the_fit_table_and_latent_sizes_match_a_real_build(folder, report, tmp_path):
    out = tmp_path / "out"
    console = Console(file=io.StringIO(), force_terminal=True, width=160)
    m = build(recipe_from_dict(_recipe_dict(folder)), out, console=console, workers=2)
    shown = console.file.getvalue()  # the plan's total and the model-loading spinner (issue 16)
    assert "7/7" in [r for r in shown.split("\r") if "plan" in r][-1]
    assert "load models: vae ltx (random weights), text minilm (bundled weights) on cpu" in shown
    written = _written_buckets(out / "lat")
    fitted = {k: set(x["items"]) for k, x in report["buckets"]["buckets"].items() if x["count"]}
    assert written == fitted
    skipped = report["buckets"]["skipped"]["skipped:too_short"]["items"]
    assert m["counts"]["examples"]["skipped:too_short"]["ids"] == skipped
    for name, sub in (("precomputed", ".precomputed"), ("latent_wds", "lat")):
        est = report["estimate"][name]
        on_disk = sum(p.stat().st_size for p in (out / sub).rglob("*") if p.is_file())
        assert abs(est["bytes"] - on_disk) <= 0.02 * on_disk, (name, est["bytes"], on_disk)
        assert est["samples"] == 5
    shapes = {k: x["latent_shape"] for k, x in report["estimate"]["latent_wds"]["buckets"].items()}
    index = json.loads((out / "lat" / "buckets.json").read_text())
    assert shapes == {k: v["latent_shape"] for k, v in index.items() if k in shapes}
    assert shapes == {"64x64x1": [128, 1, 2, 2], "64x64x9": [128, 2, 2, 2], "96x64x17": [128, 3, 2, 3]}


def test_a_large_folder_is_probed_through_a_deterministic_sample(folder):
    r = recipe_from_dict(_recipe_dict(folder))
    a, b = scan(r, max_probe=3), scan(r, max_probe=3)
    assert a["videos"]["count"] + a["audio"]["files"] == 3 and a["videos"]["sampled_out"] == 3
    assert a["videos"] == b["videos"] and a["buckets"] == b["buckets"]
    assert any("3 clip(s) were not probed" in w for w in a["warnings"])
    assert "not probed" in format_scan(a)
    assert a["estimate"]["precomputed"].get("scaled")


def test_the_latent_estimate_says_what_it_cannot_know(folder):
    d = _recipe_dict(folder)
    d["models"]["vae"] = {"family": "ltx", "pretrained": str(folder / "no-such-vae")}
    rep = scan(recipe_from_dict(d))
    assert "config.json" in rep["estimate"]["precomputed"]["not_estimated"]
    d = _recipe_dict(folder)
    d["models"]["text"] = {"family": "t5", "pretrained": str(folder / "no-such-t5")}
    est = scan(recipe_from_dict(d))["estimate"]["latent_wds"]
    assert est["bytes"] > 0 and est["text"] is None and "text embeddings not estimated" in est["partial"][0]


def test_scan_progress_bars_have_totals(folder):
    console = Console(file=io.StringIO(), force_terminal=True, width=120)
    progress = Progress(console=console)
    scan(recipe_from_dict(_recipe_dict(folder)), progress=progress)
    done = {h["label"]: h for h in progress.history}
    assert done["plan"]["total"] == done["plan"]["completed"] == 7  # 5 clips, 1 audio file, 1 photo
    assert done["probe clips"]["total"] == done["probe clips"]["completed"] == 6
    assert done["decode"]["total"] == done["decode"]["completed"] == 1
    assert "7/7" in console.file.getvalue() and "6/6" in console.file.getvalue()


@pytest.mark.slow  # 3-7 s under load: the fast lane keeps under two minutes
def test_cli_scan_a_folder_and_a_recipe_with_json(folder, tmp_path):
    runner = CliRunner()
    r = runner.invoke(app, ["scan", str(folder)])
    assert r.exit_code == 0, r.output
    assert "videos (5 probed" in r.output and "frames" in r.output
    rec = tmp_path / "r.yaml"
    rec.write_text(yaml.safe_dump(_recipe_dict(folder)), encoding="utf-8")
    r = runner.invoke(app, ["scan", "--recipe", str(rec), "--json", "--quiet"])
    assert r.exit_code == 0, r.output
    rep = json.loads(r.stdout)
    assert rep["buckets"]["skipped"]["skipped:too_short"]["items"] == ["media/short.mp4"]
    assert rep["estimate"]["latent_wds"]["bytes"] > 0 and rep["sources"]["media"]["license"] == "cc-by-4.0"
    r = runner.invoke(app, ["scan", "--recipe", str(rec)])
    assert r.exit_code == 0 and "96x64x17: 2 x [128, 3, 2, 3]" in r.output
    r = runner.invoke(app, ["scan"])
    assert r.exit_code == 2 and "--recipe" in r.output
