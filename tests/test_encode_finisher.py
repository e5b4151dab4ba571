"""The encoder's scheduler (``encode/finisher.py``) on its own: it batches results per bucket in the
order they come, hands each finished batch to whatever renders members (no sink needed), and encode/
and sinks/ do not import each other (the finisher reaches the sinks only through the renderer)."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

from shardsmith.encode.finisher import LatentFinisher
from shardsmith.encode.stage import EncodeStage
from shardsmith.encode.vae import load_vae
from shardsmith.records import PlannedItem, SampleResult

SRC = Path(__file__).resolve().parents[1] / "src" / "shardsmith"


def _imports(folder: str) -> set[str]:
    out = set()
    for path in (SRC / folder).glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module:
                out.add(node.module)
            elif isinstance(node, ast.Import):
                out.update(a.name for a in node.names)
    return out


def test_encode_and_sinks_do_not_import_each_other():
    assert not {m for m in _imports("sinks") if m.startswith("shardsmith.encode")}
    assert not {m for m in _imports("encode") if m.startswith("shardsmith.sinks")}


class _Recorder:
    def __init__(self):
        self.started, self.batches = 0, []

    def start(self, stage) -> None:
        self.started += 1

    def render(self, batch, z, texts) -> None:
        self.batches.append(([item.key for item, _ in batch], tuple(z.shape), texts))
        for _, res in batch:
            res.members = {"latent": b""}

    def sizes(self, item, res, stage):
        return []


def _entry(i: int, bucket: str, width: int) -> tuple[PlannedItem, SampleResult]:
    item = PlannedItem(idx=i, item_id=f"p/{i}.jpg", key=f"k{i}", source=0, path=f"/x/{i}.jpg", relpath=f"{i}.jpg",
                       caption=None, label=None, label_name=None, meta={}, sha256=None, size_bytes=1, kind="image",
                       width=width, height=32, image_format="JPEG", mode="RGB", split="train", plan_status="ok")
    pixels = np.random.default_rng(i).integers(0, 256, (1, 32, width, 3), dtype=np.uint8)
    return item, SampleResult(idx=i, status="written", info={"bucket": bucket}, pixels=pixels)


def test_batches_form_per_bucket_in_order_and_go_to_the_renderer():
    stage = EncodeStage(load_vae("sd"), None, batch_size=2, device="cpu")
    rec = _Recorder()
    fin = LatentFinisher(rec, lambda: stage)
    entries = [_entry(0, "32x32x1", 32), _entry(1, "32x32x1", 32), _entry(2, "48x32x1", 48),
               _entry(3, "32x32x1", 32), _entry(4, "48x32x1", 48)]
    try:
        for item, res in entries:
            fin.add(item, res)
        tag = fin.seal()  # on a CPU the unit's short batch ([k3]) goes now
        fin.finish_through(tag)
        assert fin.ready(tag)
    finally:
        fin.close()
    c, s = stage.vae.spec.latent_channels, stage.vae.spec.spatial
    assert rec.started == 1
    assert rec.batches == [(["k0", "k1"], (2, c, 32 // s, 32 // s), None),
                           (["k2", "k4"], (2, c, 32 // s, 48 // s), None),
                           (["k3"], (1, c, 32 // s, 32 // s), None)]
    assert all(res.members == {"latent": b""} and res.pixels is None for _, res in entries)
    assert stage.launched == 5


def test_a_gpu_s_waveforms_are_stacked_ahead_on_the_staging_thread():
    """On a GPU a batch's waveforms are stacked (``stage.stage_audio``) on the finisher's staging thread, in
    order, and the device thread only launches them (``_audio_latents`` takes the future); the time its
    stacking ended marks the batch for the GPU's idle causes; a stacking error surfaces on the device thread as before; off a
    GPU the waveforms go to the device thread as they are."""
    import threading

    from shardsmith.encode.audio_vae import StagedAudio
    from shardsmith.encode.finisher import LatentFinisher, _audio_latents

    class Stage:
        device = "cuda"

        def __init__(self):
            self.threads = []

        def stage_audio(self, waves):
            self.threads.append(threading.current_thread().name)
            if waves == ["bad"]:
                raise ValueError("audio clip 0: expected a stereo waveform [2, N]")
            return StagedAudio(len(waves), [([i], w, 16000) for i, w in enumerate(waves)], staged_at=5.0)

        def launch_audio(self, staged):
            return staged

    st = Stage()
    fin = LatentFinisher(members=None, stage=st)
    futs = [fin._staged(st, [f"w{i}", f"v{i}"]) for i in range(3)]
    launched = [_audio_latents(st, f, 1.5) for f in futs]
    # the stacking's end marks the batch (set by stage_audio, 5.0 here), not the hand-over (1.5)
    assert [x.groups[0][1] for x in launched] == ["w0", "w1", "w2"] and all(x.staged_at == 5.0 for x in launched)
    assert st.threads == ["shardsmith-stage_0"] * 3
    assert _audio_latents(st, ["w"], 1.5).staged_at == 1.5  # stacked on the device thread: the hand-over
    with pytest.raises(ValueError, match="audio clip 0"):
        _audio_latents(st, fin._staged(st, ["bad"]), None)
    assert fin._staged(st, None) is None
    fin.close()
    st.device = "cpu"
    assert LatentFinisher(members=None, stage=st)._staged(st, ["w"]) == ["w"]


def test_stacking_audio_binds_the_stage_s_gpu_on_the_calling_thread(monkeypatch):
    """``EncodeStage.stage_audio`` runs on the finisher's staging thread on a GPU: it makes ``models.device``'s
    GPU that thread's current device first (``bind_device``), so the page-locked memory belongs there and
    no CUDA context is opened on GPU 0 of a build on ``cuda:1``."""
    from shardsmith.encode.audio_vae import load_audio_vae

    st = EncodeStage.__new__(EncodeStage)
    st.audio_vae, st.seconds = load_audio_vae(config="tiny", vocoder=False), {"prepare": 0.0}
    calls = []
    monkeypatch.setattr(st, "bind_device", lambda: calls.append("bound"))
    staged = st.stage_audio([np.zeros((2, 16000), np.float32), None])
    assert calls == ["bound"] and staged.n == 2 and st.seconds["prepare"] > 0


@pytest.mark.parametrize("family,frames", [("sd", 1), ("ltx2", 9)])
def test_the_vae_input_is_the_pixels_scaled_to_minus_one_one_contiguous(family, frames):
    # staged uint8 [B, F, H, W, 3] -> [B, 3, (F,) H, W] in [-1, 1], contiguous (cuDNN's fast kernels), with the
    # arithmetic every earlier build used (uint8 -> the VAE's dtype, / 127.5, - 1): the latents' bytes depend on it
    import torch

    vae = load_vae(family, dtype="bfloat16")
    stage = EncodeStage(vae, None, batch_size=2, device="cpu")
    host = torch.from_numpy(np.random.default_rng(3).integers(0, 256, (2, frames, 16, 24, 3), dtype=np.uint8))
    x = stage._to_input(host)
    want = host.permute(0, 4, 1, 2, 3).to(torch.bfloat16).div_(127.5).sub_(1.0).contiguous()
    want = want[:, :, 0] if frames == 1 else want
    assert x.dtype == torch.bfloat16 and x.is_contiguous() and tuple(x.shape) == tuple(want.shape)
    assert torch.equal(x, want) and x.min() >= -1 and x.max() <= 1
