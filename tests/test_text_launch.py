"""Batches without pixels (``prompt_wds``, audio-only items) start their text embeddings with
``EncodeStage.launch_text``: the encoder thread returns once the work is queued, and the finisher waits
for it only when it serialises the batch (BENCHMARKS.md §10, the T5-XXL text build)."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from shardsmith.encode.finisher import LatentFinisher, TextOnlyBatch
from shardsmith.encode.pending import PendingBatch
from shardsmith.encode.stage import EncodeStage
from shardsmith.encode.text import load_text_encoder


def _stage():
    return EncodeStage(None, load_text_encoder("t5", config="tiny", max_length=16), batch_size=4, device="cpu")


def test_launched_text_equals_the_synchronous_text_in_caption_order():
    captions = ["a red fox", "a blue bird", "a red fox", ""]
    want = _stage().text(captions)
    st = _stage()
    st.text(["a blue bird"])  # one caption cached before the launch
    pend = st.launch_text(captions)
    assert isinstance(pend, PendingBatch) and pend.todo == ["", "a red fox"]
    z, got = pend.result_batch()
    assert z is None and len(got) == len(captions)
    for (e1, m1), (e2, m2) in zip(want, got):
        assert e1.shape == e2.shape == (16, st.text_encoder.spec.dim) and e1.dtype == e2.dtype
        assert torch.equal(e1, e2) and torch.equal(m1, m2)
    assert st.seconds["text"] > 0


class _Queued(PendingBatch):
    """A launched text batch still running on the device."""

    def __init__(self):
        self.finished = False
        self.resolved = 0

    def done(self) -> bool:
        return self.finished

    def result_batch(self):
        self.resolved += 1
        return None, [(torch.zeros(2), torch.ones(2))]


class _Stage:
    text_encoder = object()

    def __init__(self):
        self.queued = _Queued()
        self.synchronous = 0

    def launch_text(self, captions):
        return self.queued

    def text(self, captions):
        self.synchronous += 1
        return [(torch.zeros(2), None)]


def test_a_text_only_batch_is_left_on_the_device_until_it_is_serialised():
    stage = _Stage()
    batch = [(SimpleNamespace(caption="a cat"), SimpleNamespace())]  # (PlannedItem, SampleResult): the caption is read
    out = LatentFinisher._text_only(stage, batch)
    assert isinstance(out, TextOnlyBatch) and stage.synchronous == 0  # no wait on the encoder thread
    assert not out.done()  # the finisher's ready() sees the batch as still running
    stage.queued.finished = True
    assert out.done()
    z, texts = out.result_batch()
    assert z is None and texts[0][1].tolist() == [1.0, 1.0]
    out.result_batch()
    assert stage.queued.resolved == 1  # resolved once


def test_staged_and_launched_audio_equals_encode_item_by_item():
    import numpy as np

    from shardsmith.encode.audio_vae import load_audio_vae

    vae = load_audio_vae(config="tiny")
    rng = np.random.default_rng(0)
    long_, short = (rng.standard_normal((2, n)).astype(np.float32) * 0.1 for n in (8000, 4000))
    waves = [long_, None, short, long_ * 0.5, None]
    want = vae.encode([w for w in waves if w is not None])
    staged = vae.stage(waves)
    assert staged.n == 5 and sorted(len(idx) for idx, _, _ in staged.groups) == [1, 2]  # one group per length
    got = vae.launch(staged).result()
    assert [g is None for g in got] == [False, True, False, False, True]
    for w, g in zip(want, [g for g in got if g is not None]):
        assert g.dtype == w.dtype and g.shape == w.shape and torch.equal(g, w)
    with __import__("pytest").raises(ValueError, match="audio clip 0: expected a stereo waveform"):
        vae.stage([np.zeros(100, np.float32)])


def test_the_finisher_hands_a_batch_s_audio_to_the_device_thread_and_waits_only_to_serialise():
    """The calling thread (the build's busiest: it takes the decode workers' results and serialises)
    only hands the waveforms over; the device thread stacks them (page-locked on a GPU) and launches
    them, and the GPU's idle gaps are judged against the hand-over."""
    import threading
    import time
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np

    calls: dict[str, object] = {}

    class Launched:
        def done(self):
            return False

    device = ThreadPoolExecutor(1, thread_name_prefix="device")

    class Stage:
        text_encoder = None
        batch_size = 1
        device = "cpu"
        launched = 0

        def stage_audio(self, waves):
            calls["staged_on"] = threading.current_thread().name
            return SimpleNamespace(n=len(waves), staged_at=None)

        def launch_audio(self, staged):
            calls["launched"] = (staged.n, staged.staged_at)
            return Launched()

        def submit(self, fn, *args):
            return device.submit(fn, *args)

    fin = LatentFinisher.__new__(LatentFinisher)
    fin.in_flight, fin.max_in_flight, fin._stage = [], 4, Stage()
    res = SimpleNamespace(pixels=None, audio=np.zeros((2, 8), np.float32), partners=None, audio_reference=None,
                          teacher=None)
    before = time.perf_counter()
    fin._submit([(SimpleNamespace(caption=None), res, 0)])
    after = time.perf_counter()
    assert res.audio is None  # the device thread owns the waveform now
    assert not fin.in_flight[0][2].result().done()  # still on the device: not ready to serialise
    assert calls["staged_on"].startswith("device")
    n, handed_at = calls["launched"]
    assert n == 1 and before <= handed_at <= after
    device.shutdown()


def _audio_stage():
    from shardsmith.encode.audio_vae import load_audio_vae

    return EncodeStage(None, None, audio_vae=load_audio_vae(config="tiny", vocoder=False), batch_size=4, device="cpu")


def test_each_audio_batch_is_booked_once_with_its_items_and_gives_a_steady_state():
    import numpy as np

    st = _audio_stage()
    wave = np.zeros((2, 8000), np.float32)
    assert st.audio_steady_state() is None
    for waves in ([wave, None, wave], [wave] * 4, [wave] * 4, [None, wave]):
        launched = st.launch_audio(st.stage_audio(waves))
        assert launched.host_times[0] <= launched.host_times[1] <= launched.host_times[2]
        st.audio_result(launched)
        st.audio_result(launched)  # serialised twice (two outputs): booked once
    assert [b.items for b in st.audio_batches] == [2, 4, 4, 1]
    ss = st.audio_steady_state()
    assert ss["batches"] == 4 and ss["items_per_s"] > 0 and ss["gpu_idle"] is None  # no GPU timeline on a CPU
    assert st.describe()["audio_steady_state"]["batches"] == 4
    assert st.seconds["audio"] > 0


def test_the_manifest_line_gives_the_audio_encoder_s_rate_and_idle_share():
    from shardsmith.manifest import model_lines

    [line] = model_lines({"device": "cuda", "batch_size": 64, "steady_state": None,
                          "audio_steady_state": {"items_per_s": 754.2, "gpu_idle": {"idle_frac": 0.125}}})
    assert "audio encoder 754.2 items/s in the steady state, GPU idle 12.5 % between its batches" in line


@__import__("pytest").mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_launched_audio_batches_are_on_the_gpu_timeline():
    import numpy as np

    from shardsmith.encode.audio_vae import load_audio_vae

    st = EncodeStage(None, None, audio_vae=load_audio_vae(config="tiny", vocoder=False, device="cuda"), batch_size=4,
                     device="cuda")
    wave = np.zeros((2, 16000), np.float32)
    for _ in range(3):
        st.audio_result(st.launch_audio(st.stage_audio([wave] * 4)))
    rows = st.audio_timeline
    assert len(rows) == 3 and all(r.staged_at <= r.launch_begin <= r.launch_end and r.gpu_start < r.gpu_end for r in rows)
    assert st.audio_steady_state()["gpu_idle"]["gaps"] >= 0
