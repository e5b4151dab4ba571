"""``models.compile``: when the VAE encoder is compiled, that compiled latents equal eager
ones, and that the cache marker makes a second run's compile count as warm."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch

from shardsmith.encode import compile as cc
from shardsmith.encode import compile_decision as cd
from shardsmith.encode.stage import EncodeStage
from shardsmith.encode.vae import load_vae
from shardsmith.recipe import RecipeError, fingerprint, recipe_from_dict


def test_compile_pays_only_when_the_saving_beats_the_cost():
    # 1M images at 750/s eager: 1333 s eager, ~667 s saved at 2x > 120 s cold compile
    yes, why = cc.compile_pays(1_000_000, 750.0, warm=False)
    assert yes and "1000000 items left" in why and "cold" in why and why.endswith("compile")
    # 100k images: 133 s eager, 67 s saved < 120 s cold ... but > 20 s with a warm cache
    assert cc.compile_pays(100_000, 750.0, warm=False)[0] is False
    assert cc.compile_pays(100_000, 750.0, warm=True)[0] is True
    assert cc.compile_pays(0, 750.0, warm=True) == (False, "nothing left to encode")


def test_compile_is_a_run_setting_not_part_of_the_fingerprint():
    base = {"sources": [{"path": "x"}], "outputs": [{"format": "wds"}]}
    fps = {fingerprint(recipe_from_dict({**base, "models": {"compile": c}}, base_dir=".")) for c in ("auto", "on", "off")}
    assert fps == {fingerprint(recipe_from_dict(base, base_dir="."))}
    with pytest.raises(RecipeError, match="compile"):
        recipe_from_dict({**base, "models": {"compile": "always"}}, base_dir=".")


def test_inductor_compiles_the_encoder_in_its_deterministic_mode(monkeypatch):
    # max-autotune timed its kernels on the device and kept the fastest: on an H100 each fresh process picked
    # others and wrote other bytes (BENCHMARKS.md §10); Inductor's deterministic mode picks them without timing
    opts = cc.inductor_options(cc.COMPILE_MODE)
    assert opts["deterministic"] is True and opts["max_autotune"] is True
    assert cc.inductor_options(None) == {"deterministic": True}
    vae = load_vae("sd")
    seen = []
    monkeypatch.setattr(vae.model.encoder, "compile", lambda **kw: seen.append(kw))
    vae.compile(mode=cc.COMPILE_MODE)
    assert seen == [{"backend": "inductor", "dynamic": False, "options": opts}]
    seen.clear()
    vae.compile(mode=cc.COMPILE_MODE, backend="aot_eager")  # a test backend takes no Inductor options
    assert seen == [{"backend": "aot_eager", "dynamic": False}]


@pytest.mark.slow
def test_inductor_compile_holds_its_deterministic_mode_through_the_trace(cache):
    # Dynamo sets Inductor's global flag back to torch's own after every trace: the options must hold for the
    # compile (torch refuses a mode and options together, so the mode travels as options too)
    import torch._inductor.config as ic
    from torch._inductor.graph import GraphLowering

    torch.manual_seed(0)
    vae = load_vae("sd")
    x = torch.rand(2, 3, 32, 32) * 2 - 1
    want = vae.encode(x)
    seen = []
    real = GraphLowering.run

    def lowering(self, *args):  # Inductor choosing its kernels: what its flag says then
        seen.append(ic.deterministic)
        return real(self, *args)

    # the process's own setting off (as with torch's deterministic algorithms off), whatever another test left
    with pytest.MonkeyPatch.context() as mp, ic.patch(deterministic=False):
        mp.setattr(GraphLowering, "run", lowering)
        vae.compile(mode=None)
        got = vae.encode(x)
        assert ic.deterministic is False  # only that compile's: the process's own setting is left as it was
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert seen and all(seen), seen
    st = EncodeStage(vae, None, batch_size=2, device="cpu", compile="on")
    assert st._deterministic() is True
    st.compile_backend = "aot_eager"
    assert st._deterministic() is False


def _batches(n: int, bs: int, seed: int = 0) -> list[torch.Tensor]:
    rng = np.random.default_rng(seed)
    return [torch.from_numpy(rng.integers(0, 256, (bs, 1, 32, 32, 3), dtype=np.uint8)) for _ in range(n)]


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    return tmp_path / "inductor"


@pytest.mark.slow
def test_compiled_encoder_gives_the_eager_latents_and_marks_the_cache(cache):
    torch.manual_seed(0)
    vae = load_vae("sd")  # tiny random-weight AutoencoderKL
    batches = _batches(3, 2)
    eager = EncodeStage(vae, None, batch_size=2, device="cpu", compile="off")
    want = [eager.encode_staged(b) for b in batches]
    assert eager.describe()["compile"] == {"setting": "off", "compiled": False,
                                           "reason": "off in the recipe (models.compile)"}
    st = EncodeStage(vae, None, batch_size=2, device="cpu", compile="on")
    st.compile_backend = "aot_eager"  # the same dynamo path, without minutes of Inductor codegen on CPU
    got = [st.encode_staged(b) for b in batches]
    for a, b in zip(want, got):
        for x, y in zip(a, b):
            torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-4)
    info = st.describe()["compile"]
    assert info["compiled"] and info["warm_cache"] is False and info["cache"] == str(cache)
    assert info["compiled_at_batch"] == 0 and info["compile_s"] >= 0
    # a second run with the same model and shape finds the cache warm
    again = EncodeStage(load_vae("sd"), None, batch_size=2, device="cpu", compile="on")
    again.compile_backend = "aot_eager"
    again.encode_staged(batches[0])
    assert again.describe()["compile"]["warm_cache"] is True


def _ledger(tmp_path, ok: int, complete: bool = True, other: int = 0):
    """A build's ledger holding ``ok`` planned items of source 0 (and ``other`` of source 1, which no latent
    output reads), and its compile record."""
    from shardsmith.encode.compile_record import CompileRecord
    from shardsmith.plan.ledger import Ledger
    from shardsmith.records import PlannedItem

    path = tmp_path / ".shardsmith" / "ledger.sqlite"
    led = Ledger(path)
    led.add_items(PlannedItem(idx=i, item_id=f"{i}.jpg", key=f"k{i}", source=int(i >= ok), path=f"/x/{i}.jpg",
                              relpath=f"{i}.jpg", caption=None, label=None, label_name=None, meta={}, sha256=None,
                              size_bytes=1, kind="image", width=32, height=32, image_format="JPEG", mode="RGB",
                              split="train", plan_status="ok") for i in range(ok + other))
    if complete:
        led.set_meta("plan_complete", True)
    led.close()
    return CompileRecord(path, ((0,),))


def _auto_stage(record, compile: str = "auto") -> EncodeStage:
    st = EncodeStage(load_vae("sd"), None, batch_size=2, device="cpu", compile=compile)
    st.device = "cuda"  # decide as on a GPU; the tensors stay on the CPU (vae.device)
    st.compile_backend = "aot_eager"
    st.compile_record = record
    return st


@pytest.mark.slow
def test_auto_decides_before_the_first_batch_and_the_build_keeps_its_decision(cache, monkeypatch, tmp_path):
    # it decided after three eager batches, from the items left: a resume (fewer items, another pace) could decide
    # otherwise, and a build's first batches were eager while the rest were compiled (other last bits)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *_: "fake GPU")
    batches = _batches(6, 2)
    short = _auto_stage(_ledger(tmp_path / "short", 12, other=50))
    for b in batches:
        short.encode_staged(b)
    got = short.describe()["compile"]
    assert got["compiled"] is False and got["reason"].startswith("auto: 12 items left") and "stay eager" in got["reason"]
    assert got["eager_items_per_s"] > 0 and got["waited_for_plan_s"] < 1 and got["decided_in"] == "first batch"
    assert short.compile_record.kept() == {"compiled": False, "reason": got["reason"]}

    monkeypatch.setitem(cc.COST_S, "cold", 0.0)  # compiling pays for any run length, cache warm or cold
    monkeypatch.setitem(cc.COST_S, "warm", 0.0)
    record = _ledger(tmp_path / "long", 12)
    long = _auto_stage(record)
    for b in batches:
        long.encode_staged(b)
    got = long.describe()["compile"]
    assert got["compiled"] is True and got["compiled_at_batch"] == 0 and got["reason"].endswith(": compile")
    assert record.kept()["compiled"] is True
    # a resume (or a second --gpus worker) of that build follows it, though it would now decide otherwise
    monkeypatch.setitem(cc.COST_S, "cold", 1e9)
    monkeypatch.setitem(cc.COST_S, "warm", 1e9)
    again = _auto_stage(record)
    again.encode_staged(batches[0])
    got = again.describe()["compile"]
    assert got["compiled"] is True and got["compiled_at_batch"] == 0
    assert got["reason"] == f"auto: as this build began ({record.kept()['reason']})"
    # off the GPU too: the record holds wherever the resume runs
    cpu = _auto_stage(record)
    cpu.device = "cpu"
    cpu.encode_staged(batches[0])
    assert cpu.describe()["compile"]["compiled"] is True
    # off (or on) is followed as set, and the manifest says the bytes differ from those written before
    from shardsmith.plan.ledger import Ledger

    led = Ledger(record.ledger_path)
    led.record_results("lat", [(0, "written", None)])  # (the compiled build wrote its first units)
    led.close()
    off = _auto_stage(record, compile="off")
    off.encode_staged(batches[0])
    got = off.describe()["compile"]
    assert got["compiled"] is False and got["note"].startswith("this build began compiled (auto: 12 items left")
    assert "differ from these in their last bits" in got["note"] and record.kept()["compiled"] is True
    # a build begun before decisions were kept (results, no record) resumes eager
    old = _ledger(tmp_path / "old", 12)
    led = Ledger(old.ledger_path)
    led.record_results("lat", [(0, "written", None)])
    led.close()
    st = _auto_stage(old)
    st.encode_staged(batches[0])
    assert st.describe()["compile"]["compiled"] is False and "before its decision was kept" in st.compile_info["reason"]


@pytest.mark.slow
def test_auto_waits_for_a_plan_running_ahead_only_as_long_as_it_must(monkeypatch, tmp_path):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *_: "fake GPU")
    monkeypatch.setattr(cd, "POLL_S", 0.01)
    host = _batches(1, 2)[0]
    # the items planned so far repay the compile: decided at once
    st = _auto_stage(_ledger(tmp_path / "a", 40, complete=False))
    st._eager_s[tuple(host.shape)] = 1.0  # 2 items/s (as the warm-up measured it)
    monkeypatch.setitem(cc.COST_S, "cold", 5.0)  # 40 items at 2/s = 20 s eager, saves 10 s > 5 s
    assert st._auto(host, cc)[:2] == (True, "auto: 40 items left at 2.0/s eager = 20 s; compiling (~2.0x) would "
                                            "save ~10 s for ~5 s of compile (cold cache): compile")
    # they do not: it waits for the plan, then decides on what was planned so far
    monkeypatch.setattr(cd, "WAIT_FOR_PLAN_S", 0.3)
    st = _auto_stage(_ledger(tmp_path / "b", 4, complete=False))
    st._eager_s[tuple(host.shape)] = 1.0
    t = time.perf_counter()
    yes, why, extra = st._auto(host, cc)
    assert time.perf_counter() - t >= 0.3 and extra["waited_for_plan_s"] >= 0.3
    assert not yes and why.startswith("auto: 4 items left")
    # the plan completes while it waits: decided on the whole plan at once
    record = _ledger(tmp_path / "c", 4, complete=False)
    monkeypatch.setattr(cd, "WAIT_FOR_PLAN_S", 30.0)
    st = _auto_stage(record)
    st._eager_s[tuple(host.shape)] = 1.0

    def finish() -> None:
        from shardsmith.plan.ledger import Ledger

        time.sleep(0.2)
        led = Ledger(record.ledger_path)
        led.set_meta("plan_complete", True)
        led.close()

    threading.Thread(target=finish).start()
    yes, why, extra = st._auto(host, cc)
    assert not yes and 0.1 <= extra["waited_for_plan_s"] < 5  # (it began waiting a little after the thread)
    # the stage closing ends a wait (a build that failed meanwhile)
    st = _auto_stage(_ledger(tmp_path / "d", 4, complete=False))
    st._eager_s[tuple(host.shape)] = 1.0
    threading.Timer(0.2, st._closing.set).start()
    t = time.perf_counter()
    assert st._auto(host, cc)[0] is False and time.perf_counter() - t < 5


def test_auto_stays_eager_off_the_gpu_and_without_a_build_s_ledger():
    batches = _batches(2, 2)
    st = EncodeStage(load_vae("sd"), None, batch_size=2, device="cpu", compile="auto")
    for b in batches:
        st.encode_staged(b)
    assert st.describe()["compile"]["reason"] == "auto: stays eager off the GPU"
    st = _auto_stage(None)
    st.encode_staged(batches[0])
    assert st.describe()["compile"] == {"setting": "auto", "compiled": False, "reason":
                                        "auto: stays eager without a build's ledger (the items to encode are not known)",
                                        "decided_in": "first batch"}


def test_the_first_record_kept_holds_and_a_read_only_one_writes_nothing(tmp_path):
    from dataclasses import replace

    from shardsmith.encode.compile_record import keep_for_readers
    from shardsmith.plan.ledger import Ledger

    led = Ledger(tmp_path / "l.sqlite")
    assert led.keep_meta("k", {"compiled": True}) == {"compiled": True}
    assert led.keep_meta("k", {"compiled": False}) == {"compiled": True}
    led.close()
    # a Ray actor's record reads the driver's and writes nothing
    reader = replace(_ledger(tmp_path / "ray", 4), read_only=True)
    assert reader.keep({"compiled": True, "reason": "mine"}) == {"compiled": True, "reason": "mine"}
    assert reader.kept() is None
    led = Ledger(reader.ledger_path)
    base = {"sources": [{"path": "x"}], "outputs": [{"format": "wds"}]}
    auto = recipe_from_dict({**base, "models": {"compile": "auto"}}, base_dir=".")
    on = recipe_from_dict({**base, "models": {"compile": "on"}}, base_dir=".")
    assert keep_for_readers(led, auto)["compiled"] is False
    assert keep_for_readers(led, on)["compiled"] is False  # a record kept earlier (the build began) holds
    led.close()
    assert reader.keep({"compiled": True, "reason": "mine"})["reason"].startswith("auto: eager on the Ray engine")
