"""Encoder warm-up and the model preload that overlaps it with planning: warming changes no
output byte, compiles before the first real batch, books no batch, stops when told, and a
failed load is re-raised to the build as it was raised."""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest
import torch

from shardsmith.build import build
from shardsmith.encode import preload as preload_mod
from shardsmith.encode.preload import ModelPreload
from shardsmith.encode.stage import EncodeStage
from shardsmith.encode.vae import load_vae
from shardsmith.recipe import recipe_from_dict
from shardsmith.transform.buckets import parse_buckets
from test_build import tree_bytes
from test_latents import _recipe, clips, ltx_build  # noqa: F401 - module fixtures reused

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _host(bs: int, seed: int = 0) -> torch.Tensor:
    rng = np.random.default_rng(seed)
    return torch.from_numpy(rng.integers(0, 256, (bs, 1, 32, 32, 3), dtype=np.uint8))


@pytest.mark.slow
def test_warm_up_compiles_before_the_first_batch_and_books_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    torch.manual_seed(0)
    vae = load_vae("sd")
    host = _host(2)
    want = EncodeStage(vae, None, batch_size=2, device="cpu", compile="off").encode_staged(host)
    st = EncodeStage(vae, None, batch_size=2, device="cpu", compile="on")
    st.compile_backend = "aot_eager"
    info = st.warm_up(parse_buckets(["32x32x1"]))
    assert info["shapes"] == ["32x32x1"] and "error" not in info and info["seconds"] >= 0
    c = st.describe()["compile"]
    assert c["compiled"] and c["compiled_at_batch"] == 0 and "compile_s" in c
    assert st.batches == [] and st.seconds["encode"] == 0.0  # the warm-up batch is not a batch of the build
    assert st._compile_pending is None  # the first real batch needs no synchronous compile pass
    got = st.encode_staged(host)
    for a, b in zip(want, got):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    assert len(st.batches) == 1 and st.describe()["warm_up"]["shapes"] == ["32x32x1"]


@pytest.mark.slow  # (builds a VAE: diffusers' import, ~5 s alone)
def test_warm_up_stops_after_the_shape_under_way_and_survives_a_failure():
    st = EncodeStage(load_vae("sd"), None, batch_size=2, device="cpu", compile="off")
    stop = threading.Event()
    stop.set()
    assert st.warm_up(parse_buckets(["32x32x1", "64x64x1", "64x32x1"]), stop=stop)["shapes"] == ["32x32x1"]

    def oom(x):
        raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")

    st.vae.encode = oom
    info = st.warm_up(parse_buckets(["32x32x1"]))
    assert info["shapes"] == [] and "out of memory" in info["error"]  # logged, left to the real batches


@pytest.mark.slow  # (imports diffusers and tries the VAE twice: ~6 s alone)
def test_preload_reraises_the_load_error_after_the_plan(tmp_path):
    rec = recipe_from_dict({"sources": [{"path": str(tmp_path)}], "geometry": {"buckets": ["64x64x1"]},
                            "models": {"vae": {"family": "sd", "pretrained": str(tmp_path / "no-such-vae")}},
                            "outputs": [{"format": "latent_wds", "dir": "lat"}]})
    with pytest.raises(Exception) as direct:
        EncodeStage.from_recipe(rec)
    p = ModelPreload(rec).start()
    p.planned()
    with pytest.raises(type(direct.value)) as via:
        p.result()
    assert str(via.value) == str(direct.value)


@pytest.mark.slow  # (two LTX builds: the module's and a warmed one)
def test_a_warmed_build_writes_the_same_bytes(clips, ltx_build, tmp_path, monkeypatch):  # noqa: F811
    """Warm-up forced on (the default does it on a GPU, or with compile=on): every output byte
    equals the unwarmed build's, and the manifest says which bucket shapes were warmed."""
    table, _ = clips
    out, m0, _ = ltx_build
    assert m0["models"]["warm_up"] is None  # CPU, compile off: nothing to tune, no warm-up
    assert m0["timings"]["load_models_overlapped_s"] >= 0

    class Warm(ModelPreload):
        def __init__(self, recipe, root=None):
            super().__init__(recipe, warm=True, root=root)

    monkeypatch.setattr(preload_mod, "ModelPreload", Warm)
    again = tmp_path / "warm"
    m = build(_recipe(table), again, quiet=True, workers=2)
    shapes = m["models"]["warm_up"]["shapes"]
    assert shapes and shapes == ["64x64x1", "64x64x9", "96x64x17"][:len(shapes)]
    assert "error" not in m["models"]["warm_up"]
    assert tree_bytes(again) == tree_bytes(out)


def test_a_model_that_cannot_load_stops_a_long_plan_early(tmp_path, monkeypatch):
    """An impossible bucket is found by the preload while the plan runs, and stops the plan then,
    not after every item has been probed; nothing is written."""
    import time as _time

    from media_factory import real_photos
    from shardsmith.plan import planner
    from shardsmith.plan.ledger import Ledger

    real_photos(tmp_path / "p", 6, seed=9, min_side=40, max_side=60)
    for i in range(400):  # 406 items
        (tmp_path / "p" / f"copy {i:03d}.jpg").write_bytes(b"not decoded: the probe below is a stand-in")
    probe = planner.probe_item

    def slow_probe(item, max_pixels):  # 406 items x 0.1 s / 4 threads: a plan of ~10 s
        _time.sleep(0.1)
        return probe(item, max_pixels)

    monkeypatch.setattr(planner, "probe_item", slow_probe)
    rec = recipe_from_dict({"sources": [{"path": str(tmp_path / "p")}], "geometry": {"buckets": ["65x64x1"]},
                            "models": {"vae": {"family": "sd"}},
                            "outputs": [{"format": "latent_wds", "dir": "lat"}]})
    with pytest.raises(Exception, match="65") as e:
        build(rec, tmp_path / "o", quiet=True, workers=1)
    assert "nearest" in str(e.value)
    led = Ledger(tmp_path / "o" / ".shardsmith" / "ledger.sqlite")
    try:
        planned = led.count_items()
        assert led.get_meta("plan_complete") is None
    finally:
        led.close()
    assert planned < 406 / 2, planned  # stopped well before the end of the plan
    assert not list((tmp_path / "o").rglob("*.tar"))


@pytest.mark.slow
def test_staging_takes_any_frame_layout():
    """A batch is staged from frames as decoders give them: contiguous, views with negative strides
    (a flip), or read-only (PyAV's): the same bytes as numpy's stack, and no warning for the user."""
    import subprocess
    import sys

    import numpy as np

    from shardsmith.encode.stage import EncodeStage

    rng = np.random.default_rng(3)
    base = [rng.integers(0, 256, (1, 8, 8, 3), dtype=np.uint8) for _ in range(3)]
    frames = [base[0], base[1][:, ::-1], base[2]]
    st = EncodeStage.__new__(EncodeStage)
    st.device, st.batch_size, st.seconds = "cpu", 8, {"prepare": 0.0}
    host = st.stage(frames)
    assert host.dtype == torch.uint8 and tuple(host.shape) == (3, 1, 8, 8, 3)
    assert np.array_equal(host.numpy(), np.stack(frames))
    code = ("import numpy as np; from shardsmith.encode.stage import EncodeStage\n"
            "a = np.arange(12, dtype=np.uint8).reshape(1, 2, 2, 3); a.flags.writeable = False\n"
            "st = EncodeStage.__new__(EncodeStage); st.device, st.batch_size, st.seconds = 'cpu', 8, {'prepare': 0.0}\n"
            "assert st.stage([a, a]).numpy().tolist() == np.stack([a, a]).tolist()\n")
    r = subprocess.run([sys.executable, "-W", "default", "-c", code], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert r.returncode == 0, r.stderr
    assert "not writable" not in r.stderr


def test_staging_copies_on_one_thread_and_restores_the_setting(monkeypatch):
    """The batch copy runs with torch's intra-op parallelism off (on a host whose cores are busy
    with decode workers, a parallel copy waits at one barrier per frame: 20x slower on the H200),
    and the caller's thread count is the same afterwards."""
    from shardsmith.encode.stage import EncodeStage

    seen = []
    real_stack = torch.stack

    def stack(*a, **k):
        seen.append(torch.get_num_threads())
        return real_stack(*a, **k)

    before = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        monkeypatch.setattr(torch, "stack", stack)
        st = EncodeStage.__new__(EncodeStage)
        st.device, st.batch_size, st.seconds = "cpu", 8, {"prepare": 0.0}
        frames = [np.full((1, 4, 4, 3), i, dtype=np.uint8) for i in range(4)]
        host = st.stage(frames)
        assert seen == [1]
        assert torch.get_num_threads() == 3
        assert np.array_equal(host.numpy(), np.stack(frames))
    finally:
        torch.set_num_threads(before)


def test_a_computing_thread_started_inside_a_one_thread_block_keeps_its_threads():
    """A CPU encoder thread that starts while the main thread stages a batch (torch's process-wide
    count lowered to 1 for that moment) still computes on the caller's thread count once pinned, so
    a CPU build's latents round the same way on every run; unpinned, it would take 1."""
    from shardsmith.encode.host_threads import one_intra_op_thread, pin_intra_op_threads

    before = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        seen = {}

        def worker(name, pin):
            if pin:
                pin_intra_op_threads(3)
            seen[name] = torch.get_num_threads()

        with one_intra_op_thread():
            for name, pin in (("unpinned", False), ("pinned", True)):
                t = threading.Thread(target=worker, args=(name, pin))
                t.start()
                t.join()
        assert seen == {"pinned": 3, "unpinned": 1}
        assert torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(before)


@pytest.mark.slow  # (a build with a VAE: ~5 s alone)
def test_warm_up_and_every_batch_of_every_split_run_on_one_device_thread(tmp_path, monkeypatch):
    """torch keeps cuDNN's autotuned plans per thread: the warm-up must run where the batches will,
    and the train and holdout outputs must share that thread, or each tunes again at its first batch."""
    from media_factory import real_photos

    seen = {"warm": set(), "launch": set()}
    warm, launch = EncodeStage._warm_up, EncodeStage.launch

    def spy_warm(self, *a, **k):
        seen["warm"].add(threading.get_ident())
        return warm(self, *a, **k)

    def spy_launch(self, *a, **k):
        seen["launch"].add(threading.get_ident())
        return launch(self, *a, **k)

    monkeypatch.setattr(EncodeStage, "_warm_up", spy_warm)
    monkeypatch.setattr(EncodeStage, "launch", spy_launch)
    monkeypatch.setattr(preload_mod.ModelPreload, "__init__", _warm_always(preload_mod.ModelPreload.__init__))
    real_photos(tmp_path / "p", 10, seed=21, min_side=40, max_side=90)
    rec = recipe_from_dict({"sources": [{"path": str(tmp_path / "p")}], "split": {"holdout": 3, "seed": 1},
                            "geometry": {"buckets": ["32x32x1"]}, "images": {"upscale": True},
                            "models": {"vae": {"family": "sd"}, "batch_size": 2},
                            "outputs": [{"format": "latent_wds", "dir": "lat"}]})
    m = build(rec, tmp_path / "o", quiet=True, workers=1)
    assert m["splits"]["train"]["written"] == 7 and m["splits"]["holdout"]["written"] == 3
    assert len(seen["warm"]) == 1 and seen["launch"] == seen["warm"], seen
    assert threading.get_ident() not in seen["launch"]


def _warm_always(init):
    def __init__(self, recipe, warm=None, root=None):
        init(self, recipe, warm=True, root=root)
    return __init__


@pytest.mark.slow
def test_a_build_failing_before_its_first_batch_leaves_no_loading_thread(tmp_path, monkeypatch):
    """The plan fails (here: a stand-in check after it) while the models still load: build() raises the plan's
    error once the loading thread has stopped, having warmed nothing up and closed what it loaded. A thread left
    loading opened the ledger later; a build forking its plan process meanwhile could hang (SQLite's lock)."""
    import shardsmith.build as build_mod
    from media_factory import real_photos
    from shardsmith.errors import UserError

    real_photos(tmp_path / "p", 4, seed=3, min_side=40, max_side=60)
    load, loaded, warmed = EncodeStage.from_recipe.__func__, [], []

    def slow_load(cls, recipe, offload=None):
        threading.Event().wait(1.5)  # still loading when the plan fails
        st = load(cls, recipe)
        loaded.append(st)
        return st

    def failing_check(ctx):
        raise UserError("the plan's stand-in failure")

    monkeypatch.setattr(EncodeStage, "from_recipe", classmethod(slow_load))
    monkeypatch.setattr(EncodeStage, "warm_up_for", lambda self, *a, **k: warmed.append(1))
    monkeypatch.setattr(build_mod, "_check_plan", failing_check)
    # a holdout given as a count: the plan's rows are final only at its end, so it is planned first (apart, while
    # the models load), never ahead of the output (plan.ahead.can_plan_ahead)
    rec = recipe_from_dict({"sources": [{"path": str(tmp_path / "p")}], "geometry": {"buckets": ["32x32x1"]},
                            "models": {"vae": {"family": "sd", "config": "tiny"}}, "split": {"holdout": 1},
                            "outputs": [{"format": "latent_wds"}]})
    with pytest.raises(UserError, match="stand-in failure"):
        build(rec, tmp_path / "o", quiet=True, workers=1)
    assert not [t for t in threading.enumerate() if t.name == "shardsmith-model-preload" and t.is_alive()]
    assert len(loaded) == 1 and warmed == [] and loaded[0]._closing.is_set()  # loaded, not warmed, closed


def test_a_cancelled_build_stops_its_text_pass_at_the_next_caption(tmp_path):
    """models.offload text-first: the pass reads captions as the plan commits them; once the build has failed
    (ModelPreload.cancel), it stops at the next caption instead of encoding every caption of the plan."""
    from shardsmith.encode.offload import Cancelled, OffloadRun
    from shardsmith.encode.text_pass import _fill

    run = OffloadRun(tmp_path, tmp_path / "ledger.sqlite")
    pre = ModelPreload(None).with_offload(run)
    seen = []

    def captions():
        for c in ("a", "b", "c"):
            seen.append(c)
            if c == "b":
                pre.cancel(wait=False)  # the build failed meanwhile
            yield c

    with pytest.raises(Cancelled):
        _fill(None, None, captions(), rows=2, counter=[0], check=run.check_cancelled)
    assert seen == ["a", "b"]
