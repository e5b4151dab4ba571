"""Audio through a whole build (issue 17): clips with real speech (espeak-ng) muxed into videos of
real photos, mono / stereo / 5.1; a clip without audio, a clip whose audio does not decode; the
gate (exit 3), ``--skip-audio``, audio-only duration buckets, and the LTX trainer's view of the
``.precomputed/`` tree (keys, shapes, dtypes, durations equal to the sampled frames)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from shardsmith.build import build
from shardsmith.recipe import recipe_from_dict
from shardsmith.safety.audio import AudioGateError
from video_factory import audio_file, broken_audio_video, pan_video

pytestmark = pytest.mark.slow

FPS = 24
BUCKET = "64x64x17"  # 17 frames at 24 fps: 0.708 s of audio per sample


def cli(*args):
    return subprocess.run([sys.executable, "-m", "shardsmith", *map(str, args)], capture_output=True, text=True,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})


def _recipe(src: Path, text: str = "minilm", **over) -> dict:
    r = {"sources": [{"path": str(src)}], "geometry": {"buckets": [BUCKET]},
         "models": {"vae": {"family": "ltx2"}, "text": {"family": text}, "audio_vae": {"family": "ltx2_audio"},
                    "batch_size": 2},
         "outputs": [{"format": "precomputed"}]}
    r.update(over)
    return r


def _clips(src: Path, layouts=("mono", "stereo", "5.1")) -> list[Path]:
    src.mkdir(parents=True, exist_ok=True)
    out = []
    for i, layout in enumerate(layouts):
        p = pan_video(src / f"clip_{layout.replace('.', '')}.mp4", frames=30, fps=FPS, size=(96, 64),
                      photo=("astronaut", "coffee", "chelsea")[i % 3], audio="speech", audio_layout=layout)
        p.with_suffix(".txt").write_text(f"a clip with {layout} speech", encoding="utf-8")
        out.append(p)
    return out


@pytest.fixture(scope="module")
def av_tree(tmp_path_factory):
    src = tmp_path_factory.mktemp("av_src")
    _clips(src)
    silent = pan_video(src / "silent.mp4", frames=30, fps=FPS, size=(96, 64), photo="rocket")
    silent.with_suffix(".txt").write_text("no sound here", encoding="utf-8")
    out = tmp_path_factory.mktemp("av") / "out"
    manifest = build(recipe_from_dict(_recipe(src, text="ltx2")), out, quiet=True)
    return out, manifest


def test_every_clip_with_audio_gets_audio_latents_the_silent_one_fails_loudly(av_tree):
    out, manifest = av_tree
    tree = out / ".precomputed"
    lat = sorted(p.relative_to(tree / "latents").as_posix() for p in (tree / "latents").rglob("*.pt"))
    aud = sorted(p.relative_to(tree / "audio_latents").as_posix() for p in (tree / "audio_latents").rglob("*.pt"))
    assert lat == aud == ["clip_51.pt", "clip_mono.pt", "clip_stereo.pt"]
    block = manifest["outputs"]["precomputed"]
    assert block["audio"]["required"] is True
    assert block["audio"]["splits"]["train"] == {"with_audio": 3, "without_audio": 0,
                                                "failed": {"failed:no_audio_stream": 1}}
    assert block["counts"]["failed"] == {"no_audio_stream": 1}
    from shardsmith.manifest import summary

    assert "  train audio: 3 sample(s) with audio latents, failed for their audio: 1 no_audio_stream " \
        "(resampled to 16000 Hz, required)" in summary(manifest)


def test_audio_latents_are_what_the_ltx_trainer_reads(av_tree):
    out, _ = av_tree
    tree = out / ".precomputed"
    for name in ("clip_mono.pt", "clip_stereo.pt", "clip_51.pt"):
        a = torch.load(tree / "audio_latents" / name, weights_only=True)
        v = torch.load(tree / "latents" / name, weights_only=True)
        assert set(a) == {"latents", "num_time_steps", "frequency_bins", "duration"}
        assert a["latents"].dtype == torch.float32 and a["latents"].ndim == 3
        c, t, f = a["latents"].shape
        assert a["num_time_steps"] == t and a["frequency_bins"] == f and isinstance(a["num_time_steps"], int)
        assert torch.isfinite(a["latents"]).all() and a["latents"].abs().sum() > 0
        # the audio lasts exactly the sampled frames: 17 frames at the clip's 24 fps, recorded as LTX-2 does
        # (the samples cut at the track's 16 kHz over that rate: 11,333 / 16,000 s)
        assert a["duration"] == int(17 / FPS * 16000) / 16000
        pixel_frames = (v["num_frames"] - 1) * 8 + 1
        assert abs(a["duration"] - pixel_frames / v["fps"]) < 1 / 25


def test_verify_passes_the_tree(av_tree):
    out, _ = av_tree
    r = cli("verify", out / ".precomputed")
    assert r.returncode == 0, r.stdout + r.stderr
    for line in ("[PASS] folders:t2v", "[PASS] conditions_keys", "[PASS] audio_latents", "[PASS] audio_duration"):
        assert line in r.stdout


def test_the_tree_holds_what_the_ltx2_trainer_reads(av_tree):
    """The contract checked with the LTX-2 trainer's own PrecomputedDataset and training step (400fd31,
    run locally on such a tree, not in CI): folders latents / audio_latents / conditions paired by relative
    path, no stem starting with ``latent_`` (the trainer pairs those by its legacy naming and loses them),
    video latents with an int grid equal to their shape, audio latents [C, T, F] with C x F = 128 for the
    published audio VAE (the tiny test one is C=2), conditions with bf16 video and audio prompt
    embeddings of L rows, L a multiple of 128 (its connectors' registers), and an int64 0/1 mask."""
    out, _ = av_tree
    tree = out / ".precomputed"
    rels = {d: sorted(p.relative_to(tree / d).as_posix() for p in (tree / d).rglob("*.pt"))
            for d in ("latents", "audio_latents", "conditions")}
    assert rels["latents"] == rels["audio_latents"] == rels["conditions"]
    assert not any(Path(r).name.startswith("latent_") for r in rels["latents"])
    for rel in rels["latents"]:
        v = torch.load(tree / "latents" / rel, weights_only=True)
        a = torch.load(tree / "audio_latents" / rel, weights_only=True)
        c = torch.load(tree / "conditions" / rel, weights_only=True)
        assert v["latents"].dtype == torch.bfloat16 and v["latents"].shape[0] == 128
        assert list(v["latents"].shape[1:]) == [v["num_frames"], v["height"], v["width"]]
        assert all(type(v[k]) is int for k in ("num_frames", "height", "width")) and type(v["fps"]) is float
        assert a["latents"].dtype == torch.float32 and a["latents"].shape[2] == 16
        assert set(c) == {"video_prompt_embeds", "audio_prompt_embeds", "prompt_attention_mask"}
        L = c["prompt_attention_mask"].shape[0]
        assert L == 1024 and L % 128 == 0 and c["prompt_attention_mask"].dtype == torch.int64
        assert set(c["prompt_attention_mask"].unique().tolist()) <= {0, 1}
        assert c["prompt_attention_mask"][-1] == 1 and c["prompt_attention_mask"][0] == 0  # left padding
        for key in ("video_prompt_embeds", "audio_prompt_embeds"):
            assert c[key].dtype == torch.bfloat16 and c[key].shape[0] == L


def test_a_minilm_tree_is_refused_by_verify_naming_the_missing_audio_embeddings(tmp_path):
    """A MiniLM text encoder writes no audio_prompt_embeds: the LTX-2 trainer's audio connector would
    stop; verify says so (and passes the audio itself)."""
    src = tmp_path / "src"
    _clips(src, ("stereo",))
    m = build(recipe_from_dict(_recipe(src)), tmp_path / "out", quiet=True)
    assert any("conditions come from a minilm text encoder, without audio_prompt_embeds" in w for w in m["warnings"])
    r = cli("verify", tmp_path / "out" / ".precomputed")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "[PASS] folders:t2v" in r.stdout and "[PASS] audio_duration" in r.stdout
    assert "[FAIL] conditions_keys: 1 of 1 condition(s) lack audio_prompt_embeds" in r.stdout


def test_no_audio_anywhere_stops_before_the_run_with_exit_3(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for i in range(2):
        pan_video(src / f"quiet{i}.mp4", frames=30, fps=FPS, size=(96, 64)).with_suffix(".txt").write_text("q")
    rec = tmp_path / "r.yaml"
    rec.write_text(yaml.safe_dump(_recipe(src)))
    r = cli("build", rec, "--out", tmp_path / "out", "--no-report")
    assert r.returncode == 3, r.stdout + r.stderr
    assert "audio is required" in r.stderr and "--skip-audio" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "out" / ".precomputed" / "latents").exists()  # stopped before any sample


def test_a_broken_decoder_stops_the_run_at_once(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for i in range(2):
        broken_audio_video(src / f"broken{i}.mp4").with_suffix(".txt").write_text("b")
    with pytest.raises(AudioGateError, match="audio decoder failed on every file tried"):
        build(recipe_from_dict(_recipe(src)), tmp_path / "out", quiet=True)
    assert not (tmp_path / "out" / ".precomputed" / "latents").exists()


def test_one_broken_audio_stream_fails_that_item_only(tmp_path):
    src = tmp_path / "src"
    _clips(src, ("stereo",))
    broken_audio_video(src / "broken.mp4").with_suffix(".txt").write_text("b")
    m = build(recipe_from_dict(_recipe(src)), tmp_path / "out", quiet=True)
    split = m["outputs"]["precomputed"]["audio"]["splits"]["train"]
    assert split["with_audio"] == 1 and split["failed"] == {"failed:audio_decode_error": 1}


def test_skip_audio_writes_no_audio_and_says_so(tmp_path):
    src = tmp_path / "src"
    _clips(src, ("stereo",))
    rec = tmp_path / "r.yaml"
    rec.write_text(yaml.safe_dump(_recipe(src)))
    r = cli("build", rec, "--out", tmp_path / "out", "--skip-audio", "--no-report", "-q")
    assert r.returncode == 0, r.stderr
    m = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert m["outputs"]["precomputed"]["audio"]["skipped"] is True
    assert not (tmp_path / "out" / ".precomputed" / "audio_latents").exists() or not any(
        (tmp_path / "out" / ".precomputed" / "audio_latents").rglob("*.pt"))
    assert len(list((tmp_path / "out" / ".precomputed" / "latents").rglob("*.pt"))) == 1


def test_audio_only_dataset_uses_duration_buckets(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for name, dur in (("long.wav", 2.6), ("mid.flac", 1.3), ("short.wav", 0.4)):
        audio_file(src / name, kind="speech", duration=dur, rate=22050, layout="mono")
        (src / name).with_suffix(".txt").write_text(f"{name} speech")
    rec = {"sources": [{"path": str(src)}],
           "models": {"text": {"family": "minilm"}, "audio_vae": {"family": "ltx2_audio"}},
           "audio": {"durations": "1.0;2.0"}, "outputs": [{"format": "precomputed"}]}
    m = build(recipe_from_dict(rec), tmp_path / "out", quiet=True)
    tree = tmp_path / "out" / ".precomputed"
    assert not (tree / "latents").exists() or not any((tree / "latents").rglob("*.pt"))
    got = {p.name: torch.load(p, weights_only=True)["duration"] for p in (tree / "audio_latents").rglob("*.pt")}
    assert got == {"long.pt": 2.0, "mid.pt": 1.0}
    assert sorted(p.name for p in (tree / "conditions").rglob("*.pt")) == ["long.pt", "mid.pt"]
    assert m["outputs"]["precomputed"]["counts"]["skipped"] == {"too_short": 1}
    from shardsmith.plan.ledger import Ledger
    from shardsmith import formats

    led = Ledger(tmp_path / "out" / formats.LEDGER_FILE)
    [(item, status, detail)] = led.result_details("precomputed", "train", "skipped:%")
    assert status == "skipped:too_short" and "0.400 s" in detail


def test_audio_not_required_writes_the_silent_clip_without_audio(tmp_path):
    src = tmp_path / "src"
    _clips(src, ("mono",))
    pan_video(src / "silent.mp4", frames=30, fps=FPS, size=(96, 64)).with_suffix(".txt").write_text("s")
    m = build(recipe_from_dict(_recipe(src, audio={"required": False})), tmp_path / "out", quiet=True)
    assert m["outputs"]["precomputed"]["audio"]["splits"]["train"]["without_audio"] == 1
    assert m["outputs"]["precomputed"]["counts"]["written"] == 2


def test_latent_wds_gets_the_same_audio_latents_encoded_once(tmp_path):
    """Both latent outputs write audio: latent_wds's audio_latent.pth holds the very tensor of the
    precomputed tree's audio_latents/ (the memo: each item's audio encoded once for both)."""
    import io
    import tarfile

    src = tmp_path / "src"
    _clips(src, ("mono", "stereo"))
    rec = _recipe(src, outputs=[{"format": "precomputed"}, {"format": "latent_wds", "dir": "lat"}])
    m = build(recipe_from_dict(rec), tmp_path / "out", quiet=True)
    assert m["outputs"]["latent_wds"]["audio"]["splits"]["train"]["with_audio"] == 2
    with tarfile.open(tmp_path / "out" / "lat" / "00000.tar") as tf:
        members = {x.name: tf.extractfile(x).read() for x in tf.getmembers()}
    for stem in ("clip_mono", "clip_stereo"):
        wds = torch.load(io.BytesIO(members[f"{stem}.audio_latent.pth"]), weights_only=True)
        pre = torch.load(tmp_path / "out" / ".precomputed" / "audio_latents" / f"{stem}.pt", weights_only=True)
        assert wds.dtype == torch.float32 and torch.equal(wds, pre["latents"])
        meta = json.loads(members[f"{stem}.json"])
        assert meta["audio"]["status"] == "written" and meta["audio"]["duration"] == pytest.approx(17 / FPS)


def test_the_plan_probes_every_clips_audio(av_tree):
    """Probed at plan time: the ledger keeps each clip's audio stream (rate, channels, layout, duration)
    or why it has none, before any item is made."""
    from shardsmith import formats
    from shardsmith.plan.ledger import Ledger

    out, _ = av_tree
    led = Ledger(out / formats.LEDGER_FILE)
    facts = {Path(it.relpath).name: it.media["target"].audio for it in led.items()}
    assert facts["silent.mp4"] == {"none": "no_audio_stream"}
    assert facts["clip_mono.mp4"]["channels"] == 1 and facts["clip_51.mp4"]["channels"] == 6
    assert facts["clip_stereo.mp4"]["layout"] == "stereo" and facts["clip_stereo.mp4"]["rate"] == 16000
    assert facts["clip_stereo.mp4"]["duration"] == pytest.approx(30 / FPS, abs=0.05)
    assert facts["clip_51.mp4"]["codec"] == "aac"


def test_an_audio_column_gives_each_clip_its_own_audio_file(tmp_path):
    """A table's audio column (columns.audio): the clip's audio comes from its partner file (a silent
    clip with a separate WAV), cut to the same window; a row whose audio file is missing fails."""
    src = tmp_path / "src"
    src.mkdir()
    pan_video(src / "a.mp4", frames=30, fps=FPS, size=(96, 64))
    pan_video(src / "b.mp4", frames=30, fps=FPS, size=(96, 64), photo="coffee")
    audio_file(src / "a.wav", kind="speech", duration=1.25, rate=44100, layout="mono")
    (src / "rows.csv").write_text("video,voice,caption\na.mp4,a.wav,first clip\nb.mp4,gone.wav,second clip\n")
    rec = _recipe(src / "rows.csv")
    rec["sources"][0]["columns"] = {"media": "video", "audio": "voice", "caption": "caption"}
    m = build(recipe_from_dict(rec), tmp_path / "out", quiet=True)
    a = torch.load(tmp_path / "out" / ".precomputed" / "audio_latents" / "a.pt", weights_only=True)
    assert a["duration"] == int(17 / FPS * 44100) / 44100  # LTX-2's: the WAV's samples over its 44.1 kHz
    assert m["outputs"]["precomputed"]["counts"]["written"] == 1
    assert m["outputs"]["precomputed"]["counts"]["failed"] == {"missing_audio": 1}

