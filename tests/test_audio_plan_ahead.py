"""An audio build's first output starts on the plan's committed rows while the plan goes on where a GPU
encodes, as a pixel build's does (BENCHMARKS.md §7: on a host whose plan outlasts the model load, the plan
was the fixed cost); on a CPU it plans first. Planning ahead writes the same bytes as planning first, the
audio preflight waits for committed rows that carry audio, and a broken decoder still stops the run before
any sample."""

from __future__ import annotations

import pytest

import shardsmith.build as build_mod
import shardsmith.plan.planner as planner
from shardsmith.build import build
from shardsmith.plan.ledger import Ledger
from shardsmith.recipe import recipe_from_dict
from shardsmith.safety.audio import AudioGateError
from test_build import tree_bytes
from video_factory import audio_file, broken_audio_video, pan_video

pytestmark = pytest.mark.slow  # whole builds with the audio VAE: 5-15 s each


@pytest.fixture(autouse=True)
def ahead_on_this_cpu(monkeypatch):
    """Audio outputs plan ahead where a GPU encodes; these tests take that order on the CPU."""
    monkeypatch.setattr(build_mod, "AUDIO_AHEAD_ON_CPU", True)


def test_an_audio_build_on_a_cpu_plans_first(tmp_path, monkeypatch):
    """On a CPU the plan's probes would take the cores the audio encoder runs on (measured slower)."""
    monkeypatch.setattr(build_mod, "AUDIO_AHEAD_ON_CPU", False)
    src = tmp_path / "src"
    src.mkdir()
    audio_file(src / "a.wav", duration=1.2, rate=16000, layout="mono")
    m = build(_audio_only(src), tmp_path / "out", quiet=True, workers=1)
    assert "plan_ahead" not in m["timings"] and m["counts"]["written"] == 1


def _audio_only(src, out_dir="lat"):
    return recipe_from_dict({
        "sources": [{"path": str(src)}], "audio": {"durations": [1.0, 2.0]},
        "models": {"audio_vae": {"family": "ltx2_audio", "config": "tiny"}, "batch_size": 2},
        "outputs": [{"format": "latent_wds", "dir": out_dir, "samples_per_shard": 2}]})


def test_an_audio_only_build_plans_ahead_with_the_bytes_of_a_plan_first_build(tmp_path, monkeypatch):
    src = tmp_path / "src"
    src.mkdir()
    for i, (dur, rate, layout) in enumerate([(1.3, 44100, "mono"), (2.4, 48000, "stereo"), (1.1, 16000, "stereo"),
                                             (2.2, 22050, "mono"), (0.4, 16000, "mono")]):
        audio_file(src / f"a{i}.{'flac' if i % 2 else 'wav'}", duration=dur, rate=rate, layout=layout)
    monkeypatch.setattr(planner, "BATCH", 2)  # rows committed two at a time
    ahead = build(_audio_only(src), tmp_path / "ahead", quiet=True, workers=1)
    assert ahead["timings"]["plan_ahead"] is True
    assert ahead["counts"]["written"] == 4 and ahead["counts"]["skipped"] == {"too_short": 1}
    monkeypatch.setattr(build_mod, "PLAN_AHEAD", False)
    first = build(_audio_only(src), tmp_path / "first", quiet=True, workers=1)
    assert "plan_ahead" not in first["timings"]
    assert tree_bytes(tmp_path / "ahead") == tree_bytes(tmp_path / "first")
    assert ahead["outputs"] == first["outputs"] and ahead["splits"] == first["splits"]


def _clips_recipe(src):
    return recipe_from_dict({
        "sources": [{"path": str(src)}], "geometry": {"buckets": ["64x64x17"]}, "split": {"holdout": 0},
        "models": {"vae": {"family": "ltx2"}, "text": {"family": "minilm"},
                   "audio_vae": {"family": "ltx2_audio", "config": "tiny"}, "batch_size": 2},
        "outputs": [{"format": "precomputed"}]})


def test_the_preflight_waits_for_committed_rows_that_carry_audio(tmp_path, monkeypatch):
    """Four of five clips are silent, the plan commits one row at a time: the preflight reads on as the
    plan commits, finds the clip with audio wherever the plan puts it, and the run goes on; nothing is
    refused as 'no audio anywhere'."""
    src = tmp_path / "src"
    src.mkdir()
    for i, photo in enumerate(("astronaut", "coffee", "chelsea", "rocket")):  # distinct: none a duplicate
        pan_video(src / f"a{i}_quiet.mp4", frames=20, fps=24, size=(80, 64), photo=photo).with_suffix(".txt") \
            .write_text("q")
    pan_video(src / "z_speech.mp4", frames=20, fps=24, size=(80, 64), photo="camera", audio="speech",
              audio_layout="stereo").with_suffix(".txt").write_text("a clip with speech")
    monkeypatch.setattr(planner, "BATCH", 1)  # one row a commit: the preflight meets the silent ones first
    m = build(_clips_recipe(src), tmp_path / "out", quiet=True, workers=1)
    assert m["timings"]["plan_ahead"] is True
    audio = m["outputs"]["precomputed"]["audio"]
    order = [it.item_id for it in Ledger(tmp_path / "out" / ".shardsmith" / "ledger.sqlite").items(split="train",
                                                                                                  status="ok")]
    assert len(order) == 5
    assert audio["preflight"] == {"decoded": "src/z_speech.mp4", "items_looked_at": order.index("src/z_speech.mp4") + 1}
    assert audio["splits"]["train"]["with_audio"] == 1 and m["counts"]["written"] == 1
    assert audio["splits"]["train"]["failed"] == {"failed:no_audio_stream": 4}  # audio required: the silent ones


def test_a_broken_decoder_stops_a_build_planning_ahead_and_the_fixed_rerun_builds(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for i in range(3):
        broken_audio_video(src / f"b{i}.mp4", frames=20).with_suffix(".txt").write_text("b")
    out = tmp_path / "out"
    with pytest.raises(AudioGateError, match="audio decoder failed on every file tried"):
        build(_clips_recipe(src), out, quiet=True, workers=1)
    assert not (out / ".precomputed" / "latents").exists() or not any((out / ".precomputed" / "latents").rglob("*.pt"))
    for i, photo in enumerate(("astronaut", "coffee", "chelsea")):  # the user replaces the files with ones that
        (src / f"b{i}.mp4").unlink()  # decode, and starts again from the sources as they are now (the plan was
        pan_video(src / f"b{i}.mp4", frames=20, fps=24, size=(80, 64), photo=photo, audio="speech",  # complete)
                  audio_layout="mono")
    m = build(_clips_recipe(src), out, quiet=True, workers=1, overwrite=True)
    assert m["counts"]["written"] == 3 and m["outputs"]["precomputed"]["audio"]["splits"]["train"]["with_audio"] == 3
    assert len(list((out / ".precomputed" / "audio_latents").rglob("*.pt"))) == 3
