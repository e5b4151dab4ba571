"""The audio encoder is warmed up with the other encoders (issue 17): one batch of silent waveforms per
audio duration the recipe knows before its plan, run while the build plans, booking nothing and changing
no output byte; the model's GPU memory is measured with the others'."""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest
import torch

from shardsmith.build import build
from shardsmith.encode import preload as preload_mod
from shardsmith.encode.audio_vae import load_audio_vae
from shardsmith.encode.preload import ModelPreload
from shardsmith.encode.stage import EncodeStage
from shardsmith.recipe import recipe_from_dict
from test_build import tree_bytes

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _rec(tmp_path, **over) -> dict:
    r = {"sources": [{"path": str(tmp_path)}], "models": {"audio_vae": {"family": "ltx2_audio"}},
         "audio": {"durations": "1.0;2.0"}, "outputs": [{"format": "latent_wds", "dir": "a"}]}
    r.update(over)
    return r


def test_the_audio_durations_known_before_the_plan(tmp_path):
    assert recipe_from_dict(_rec(tmp_path)).audio_encode_seconds() == [1.0, 2.0]
    clips = _rec(tmp_path, geometry={"buckets": ["64x64x17", "64x64x1", "96x64x25"], "fps": 24},
                 models={"vae": {"family": "ltx2"}, "audio_vae": {"family": "ltx2_audio"}})
    assert recipe_from_dict(clips).audio_encode_seconds() == [1.0, 2.0, 17 / 24, 25 / 24]  # (stills: no audio)
    native = {**clips, "geometry": {"buckets": ["64x64x17"]}}  # a clip's native rate: only its probe knows
    assert recipe_from_dict(native).audio_encode_seconds() == [1.0, 2.0]
    assert recipe_from_dict(_rec(tmp_path, audio={"skip": True})).audio_encode_seconds() == []


def test_the_audio_encoder_warms_each_duration_books_nothing_and_changes_nothing():
    torch.manual_seed(0)
    vae = load_audio_vae(config="tiny", vocoder=False)
    wave = np.random.default_rng(1).standard_normal((2, 16000)).astype(np.float32) * 0.1
    want = EncodeStage(None, None, audio_vae=vae, batch_size=2, device="cpu").audio_vae.encode([wave, wave])
    st = EncodeStage(None, None, audio_vae=vae, batch_size=2, device="cpu")
    try:
        info = st.warm_up([], audio_seconds=[1.0, 0.5])
        assert info["audio"] == ["1 s", "0.5 s"] and "error" not in info
        assert st.audio_batches == [] and st.seconds["audio"] == 0.0  # a warm-up batch is no batch of the build
        [mem] = [m for m in st.memory if m.name == "audio"][:1]
        assert mem.batch == 2 and mem.param_bytes > 0 and mem.peak_bytes is None  # (peaks on a GPU only)
        got = st.audio_vae.encode([wave, wave])
        assert all(torch.equal(a, b) for a, b in zip(want, got))
        stop = threading.Event()
        stop.set()  # told before it began (the plan is done, a batch waits): nothing more is warmed
        assert "audio" not in st.warm_up([], stop=stop, audio_seconds=[1.0, 0.5])

        class StopAfterFirst:  # told while the first duration is under way: that one is finished
            calls = 0

            def is_set(self):
                self.calls += 1
                return self.calls > 1

        assert st.warm_up([], stop=StopAfterFirst(), audio_seconds=[1.0, 0.5])["audio"] == ["1 s"]
    finally:
        st.close()


@pytest.mark.slow
def test_a_warmed_audio_build_writes_the_same_bytes(tmp_path, monkeypatch):
    """Warm-up forced on (the default does it on a GPU): the same bytes, and the manifest names the
    audio durations warmed."""
    from video_factory import audio_file

    src = tmp_path / "src"
    src.mkdir()
    for name, dur in (("long.wav", 2.6), ("mid.flac", 1.3), ("late.wav", 2.2)):
        audio_file(src / name, kind="speech", duration=dur, rate=22050, layout="mono")
    rec = _rec(src, models={"audio_vae": {"family": "ltx2_audio"}, "batch_size": 2})
    m0 = build(recipe_from_dict(rec), tmp_path / "cold", quiet=True, workers=2)
    assert m0["models"]["warm_up"] is None  # CPU: nothing warmed by default

    class Warm(ModelPreload):  # every duration warmed (a plan this short would stop it before the first)
        def __init__(self, recipe, root=None):
            super().__init__(recipe, warm=True, root=root)

        def planned(self):
            pass

        def result(self, stop_warm_up=True):
            return super().result(stop_warm_up=False)

    monkeypatch.setattr(preload_mod, "ModelPreload", Warm)
    m = build(recipe_from_dict(rec), tmp_path / "warm", quiet=True, workers=2)
    warm = m["models"]["warm_up"]
    assert warm.get("audio") == ["1 s", "2 s"] and "error" not in warm, warm
    assert m["counts"]["written"] == 3
    assert tree_bytes(tmp_path / "warm") == tree_bytes(tmp_path / "cold")
