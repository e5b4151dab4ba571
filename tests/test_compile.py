"""``models.compile``: when the VAE encoder is compiled, that compiled latents equal eager
ones, and that the cache marker makes a second run's compile count as warm."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from shardsmith.encode import compile as cc
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


@pytest.mark.slow
def test_auto_decides_after_the_first_batches_from_the_items_left(cache, monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *_: "fake GPU")
    batches = _batches(6, 2)

    def run(remaining: int) -> EncodeStage:
        st = EncodeStage(load_vae("sd"), None, batch_size=2, device="cpu", compile="auto")
        st.device = "cuda"  # decide as on a GPU; the tensors stay on the CPU (vae.device)
        st.compile_backend = "aot_eager"
        st.expect(remaining)
        for b in batches:
            st.encode_staged(b)
        return st

    short = run(12).describe()["compile"]
    assert short["compiled"] is False and short["reason"].startswith("auto: ") and "stay eager" in short["reason"]
    assert "4 items left" in short["reason"]  # 12 expected; decided after 1 + 3 batches of 2
    monkeypatch.setitem(cc.COST_S, "cold", 0.0)  # make compiling pay for any run length
    long = run(10**9).describe()["compile"]
    assert long["compiled"] is True and long["compiled_at_batch"] == 1 + cc.DECIDE_AFTER_BATCHES
    assert long["reason"].endswith(": compile")
    # units smaller than a batch (shards bounded by bytes): every batch is short, padded to
    # batch_size on a GPU; its device time is a full batch's, so auto decides on them too
    padded = EncodeStage(load_vae("sd"), None, batch_size=2, device="cpu", compile="auto")
    padded.device = "cuda"
    padded.compile_backend = "aot_eager"
    padded.expect(10**9)
    for b in batches:
        padded.encode_staged(b, n=1)  # 2 rows on the device, 1 of them an item
    got = padded.describe()["compile"]
    assert got["compiled"] is True and got["compiled_at_batch"] == 1 + cc.DECIDE_AFTER_BATCHES, got
    assert got["eager_items_per_s"] > 0
    # short batches that were NOT padded (a smaller shape) are not full-batch times
    short_rows = EncodeStage(load_vae("sd"), None, batch_size=2, device="cpu", compile="auto")
    short_rows.device = "cuda"
    short_rows.expect(10**9)
    for b in batches:
        short_rows.encode_staged(b[:1])
    assert short_rows.describe()["compile"] == {"setting": "auto", "compiled": False, "reason": None}
    # off the GPU, auto never compiles
    st = EncodeStage(load_vae("sd"), None, batch_size=2, device="cpu", compile="auto")
    st.expect(10**9)
    for b in batches:
        st.encode_staged(b)
    assert st.describe()["compile"]["reason"] == "auto: stays eager off the GPU"
