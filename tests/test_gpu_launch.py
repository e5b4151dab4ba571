"""The asynchronous GPU path of the encode stage (``EncodeStage.launch``) gives exactly what the
synchronous path gives, item by item, in order, with captions kept with their own items.

These run only where CUDA is present (the GPU machine: ``python3 -m pytest tests/test_gpu_launch.py``);
on the CPU ``launch`` runs the synchronous path, which the other encode tests cover.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from shardsmith.encode.stage import EncodeStage
from shardsmith.encode.text import load_text_encoder
from shardsmith.encode.vae import load_vae

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _frames(n: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, (1, 64, 64, 3), dtype=np.uint8) for _ in range(n)]


def test_launched_batches_equal_the_synchronous_ones_with_their_captions():
    torch.backends.cudnn.deterministic = True
    vae = load_vae("sd", device="cuda", dtype="float32")
    text = load_text_encoder("t5", device="cuda")  # tiny random-weight T5 (stand-in tokenizer)
    st = EncodeStage(vae, text, batch_size=4, device="cuda")
    ref = EncodeStage(vae, text, batch_size=4, device="cuda")
    batches = [_frames(4, 0), _frames(4, 1), _frames(3, 2)]  # the last one short (padded to 4)
    captions = [["a cat", "a dog", "", "a cat"], ["the sea", "", "a red car", "the sea"], ["a dog", "x", ""]]
    # launch every batch before collecting any: results must still come back per batch, in order
    pending = [st.launch(st.stage(b), len(b), c) for b, c in zip(batches, captions)]
    for p, b, caps in zip(pending, batches, captions):
        lat, texts = p.result()
        want = ref.encode_staged(ref.stage(b), len(b))
        want_t = ref.text(caps)
        assert len(lat) == len(b) == len(texts)
        for got, exp in zip(lat, want):
            assert got.device.type == "cpu" and got.dtype == exp.dtype and got.shape == exp.shape == (4, 8, 8)
            # same kernels, but cuDNN may pick another algorithm on another call: float32 rounding
            torch.testing.assert_close(got, exp, rtol=1e-4, atol=1e-5)
            assert got.untyped_storage().nbytes() == got.numel() * got.element_size()  # own memory, no view
        for (e, m), (we, wm), c in zip(texts, want_t, caps):
            torch.testing.assert_close(e, we, rtol=1e-4, atol=1e-5)
            assert torch.equal(m, wm) and e.device.type == "cpu" and e.shape == (text.spec.max_length, text.spec.dim)
    assert p.done()
    ss = st.steady_state()
    assert ss["batches"] == 3 and ss["median_batch_encode_s"] > 0
    times = [t for t, *_ in st.batches]
    assert times == sorted(times) and st.seconds["encode"] > 0


def test_launch_after_compile_first_batch_is_timed_synchronously(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    vae = load_vae("sd", device="cuda", dtype="float32")
    st = EncodeStage(vae, None, batch_size=2, device="cuda", compile="on")
    st.compile_backend = "aot_eager"
    p = st.launch(st.stage(_frames(2, 0)), 2)
    assert p.latents is not None  # measured to completion at launch
    p2 = st.launch(st.stage(_frames(2, 1)), 2)
    lat, _ = p2.result()
    assert len(lat) == 2 and st.describe()["compile"]["compiled"] is True


def test_many_batches_in_flight_each_get_their_own_pixels():
    """Host->device copies run on a side stream while earlier batches compute, and page-locked
    staging buffers are freed and reused as batches go: every batch must still encode its own
    pixels (a copy that read a reused buffer, or a kernel that ran before its copy, would not)."""
    torch.backends.cudnn.deterministic = True
    vae = load_vae("sd", device="cuda", dtype="float32")
    st = EncodeStage(vae, None, batch_size=8, device="cuda")
    ref = EncodeStage(vae, None, batch_size=8, device="cuda")
    batches = [_frames(8, 100 + i) for i in range(12)]
    pending = []
    for b in batches:  # at most three in flight, as the build keeps them; staging buffers recycle
        pending.append((b, st.launch(st.stage(b), len(b))))
        if len(pending) > 3:
            b0, p0 = pending.pop(0)
            _check(p0, ref, b0)
    for b0, p0 in pending:
        _check(p0, ref, b0)


def _check(p, ref, frames):
    lat, _ = p.result()
    want = ref.encode_staged(ref.stage(frames), len(frames))
    for got, exp in zip(lat, want):
        torch.testing.assert_close(got, exp, rtol=1e-4, atol=1e-5)


def test_result_batch_is_the_per_item_results_stacked():
    """The build takes a launched batch's latents as one page-locked tensor (``result_batch``):
    row i must be item i of ``result()``."""
    vae = load_vae("sd", device="cuda", dtype="float32")
    st = EncodeStage(vae, None, batch_size=4, device="cuda")
    frames = _frames(3, 7)
    p = st.launch(st.stage(frames), len(frames))
    z, texts = p.result_batch()
    assert texts is None and z.device.type == "cpu" and tuple(z.shape) == (3, 4, 8, 8) and z.is_contiguous()
    lat, _ = p.result()
    assert len(lat) == 3 and all(torch.equal(a, z[i]) for i, a in enumerate(lat))


def test_the_gpu_idle_account_gives_a_late_batch_to_its_pixels():
    """A batch staged 50 ms after the device ran dry shows as a ~50 ms gap caused by ``pixels``; batches
    queued back to back leave no gap worth the name; the parts add up to the idle time."""
    import time

    vae = load_vae("sd", device="cuda", dtype="float32")
    st = EncodeStage(vae, None, batch_size=4, device="cuda")
    pend = [st.launch(st.stage(_frames(4, i)), 4, staged_at=time.perf_counter()) for i in range(3)]
    for p in pend:
        p.result()
    time.sleep(0.05)
    late = st.launch(st.stage(_frames(4, 9)), 4, staged_at=time.perf_counter())
    late.result()
    idle = st.steady_state()["gpu_idle"]
    assert len(st.timeline) == 4
    assert idle["by_cause_s"]["pixels"] >= 0.045
    assert idle["idle_s"] == pytest.approx(sum(idle["by_cause_s"].values()), abs=1e-3)
    assert 0 < idle["idle_frac"] < 1 and idle["span_s"] > 0.05
    assert st.steady_state()["median_batch_gpu_s"] > 0
    first = st.steady_state()["first_batch"]
    assert 0 <= first["staged_s"] <= first["launch_begun_s"] <= first["queued_s"]
    assert first["gpu_start_s"] >= first["launch_begun_s"]


def test_audio_batches_in_flight_each_get_their_own_waveforms_resampled_on_the_gpu():
    """Audio groups are uploaded on a side stream and resampled on the GPU (audio.resampler: sinc): with
    several batches in flight and page-locked buffers recycled, every batch must still encode its own
    waveforms, as ``encode`` (synchronous) gives them."""
    from shardsmith.encode.audio_vae import load_audio_vae
    from shardsmith.records import Waveform

    torch.backends.cudnn.deterministic = True
    vae = load_audio_vae(config="tiny", vocoder=False, device="cuda")
    g = np.random.default_rng(0)
    batches = [[Waveform((g.standard_normal((c, 44100)) * 0.1).astype(np.float32), 44100) for c in (1, 2, 2, 1)]
               for _ in range(10)]
    pending = []
    for b in batches:
        pending.append((b, vae.launch(vae.stage(b))))
    assert vae._copy_stream is not None
    for b, launched in pending:
        for got, want in zip(launched.result(), vae.encode(b)):
            assert tuple(got.shape) == (2, 26, 16)  # 1.0 s at 16 kHz once resampled: 16000 // 640 + 1
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)



def test_a_batchs_captions_run_beside_its_vae_batch_without_waiting_for_it():
    """After the warm-up (which decides that both fit), a batch's text forward is queued on the text encoder's own
    stream: launching a batch returns while the device still runs the work queued before it (transformers reads a
    mask's values on the host, which on one stream waited for the whole VAE batch), with the same latents and
    embeddings as the synchronous path."""
    import time

    torch.backends.cudnn.deterministic = True
    vae = load_vae("sd", device="cuda", dtype="float32")
    text = load_text_encoder("t5", device="cuda")  # tiny random-weight T5 (stand-in tokenizer)
    st = EncodeStage(vae, text, batch_size=2, device="cuda")
    ref = EncodeStage(vae, text, batch_size=2, device="cuda")
    from shardsmith.transform.buckets import parse_buckets

    st.warm_up(parse_buckets(["64x64x1"]))
    assert st.text_beside
    frames, caps = _frames(2, 3), ["a cat on a mat", "the sea"]
    st.launch(st.stage(frames), 2, caps).result()  # (first use: the text stream made, its memory allocated)
    staged = st.stage(frames)
    torch.cuda.synchronize()
    torch.cuda._sleep(3_000_000_000)  # (the device busy for about two seconds, as with a long VAE batch)
    caps = ["a red car in the rain", "two dogs"]  # (not in the stage's caption cache: the text encoder runs)
    t = time.perf_counter()
    pend = st.launch(staged, 2, caps)
    host_s = time.perf_counter() - t
    assert pend.todo == sorted(caps)
    assert not pend.done() and host_s < 0.5  # returned while the device still ran the work before it
    lat, texts = pend.result()
    want, want_t = ref.encode_staged(ref.stage(frames), 2), ref.text(caps)
    for got, exp in zip(lat, want):
        torch.testing.assert_close(got, exp, rtol=1e-4, atol=1e-5)
    for (e, m), (we, wm) in zip(texts, want_t):
        assert torch.equal(e, we) and torch.equal(m, wm)
    assert st.describe()["memory"]["beside"] == ["text"]


def test_a_normalised_vae_batch_is_queued_without_waiting_for_the_device():
    """A VAE whose latents are normalised per channel (LTX-2's mean and std) launches a batch and returns while the
    device still runs the work queued before it: the statistics are made on the device once, not copied from a
    list every batch (a copy the host waits for, behind the batch's own forward), with the same latents."""
    import time

    vae = load_vae("ltx2", device="cuda", dtype="float32")  # tiny random-weight LTX-2 VAE (mean/std normalised)
    assert vae.spec.normalisation["type"] != "scale_shift"
    st = EncodeStage(vae, None, batch_size=1, device="cuda")
    clip = [np.random.default_rng(5).integers(0, 256, (9, 64, 64, 3), dtype=np.uint8)]
    want = st.launch(st.stage(clip), 1).result()[0][0]
    staged = st.stage(clip)
    torch.cuda.synchronize()
    torch.cuda._sleep(3_000_000_000)  # (the device busy for about two seconds)
    t = time.perf_counter()
    pend = st.launch(staged, 1)
    host_s = time.perf_counter() - t
    assert not pend.done() and host_s < 0.5
    assert torch.equal(pend.result()[0][0], want)
