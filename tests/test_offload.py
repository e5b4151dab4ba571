"""``models.offload`` (issue 23): text encoded first into the build's text cache, the text encoder freed before
the VAE is built, the same bytes as a build without it; ``auto`` settled by the memory arithmetic, kept on
resume; the recipe and distribution refusals."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path

import pytest

from shardsmith.encode import offload
from shardsmith.encode.memory_plan import ModelMemory
from shardsmith.encode.offload import OffloadDecision, OffloadError, decide
from shardsmith.plan.ledger import Ledger
from shardsmith.recipe import RecipeError, recipe_from_dict

GIB = 2 ** 30
CAPTIONS = ["a red fox", "a red fox", "snow on a hill", "", "a harbour at dusk", "a red fox"]


def _mem(name: str, weights_gib: float, per_item_gib: float, batch: int = 2) -> ModelMemory:
    return ModelMemory(name, f"{name} test", batch, int(weights_gib * GIB),
                       int((weights_gib + batch * per_item_gib) * GIB))


def _data(tmp_path: Path) -> Path:
    from media_factory import real_photos

    src = tmp_path / "src"
    paths = real_photos(src, len(CAPTIONS), seed=3, min_side=64, max_side=96)
    for p, c in zip(sorted(paths), CAPTIONS):
        if c:
            p.with_suffix(".txt").write_text(c)
    return src


def _recipe(src: Path, offload_setting: str | None = None, **models):
    m = {"vae": {"family": "sd", "config": "tiny"}, "text": {"family": "minilm"}, "device": "cpu", "batch_size": 2,
         **models}
    if offload_setting is not None:
        m["offload"] = offload_setting
    return recipe_from_dict({"sources": [{"path": str(src)}], "geometry": {"buckets": ["64x64x1"]}, "models": m,
                             "outputs": [{"format": "precomputed"},
                                         {"format": "latent_wds", "dir": "wds", "samples_per_shard": 4}]})


def _files(out: Path) -> dict[str, bytes]:
    return {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*"))
            if p.is_file() and ".shardsmith" not in p.parts and p.name not in ("manifest.json", "report.html")}


# ---------------------------------------------------------------- the arithmetic of auto


def test_auto_is_off_when_both_fit_text_first_when_only_each_fits_and_refused_when_one_never_fits():
    text, vae = _mem("text", 12.6, 0.9), _mem("vae", 2.3, 8.5)
    both = decide("auto", text, vae, 40 * GIB)
    assert both.mode == "off" and "both fit" in both.reason  # 12.6 + 2.3 + 17.0 = 31.9 <= 36
    small = decide("auto", text, vae, 23 * GIB)  # 24 GB card: 31.9 > 20.7, alone 13.5 and 10.8
    assert small.mode == "text-first" and small.setting == "auto"
    assert small.together_bytes == text.param_bytes + vae.peak_bytes  # the VAE's activations are the larger
    assert small.vae_bytes == vae.param_bytes + vae.per_item_bytes  # alone: the weights and one item
    with pytest.raises(OffloadError) as err:
        decide("auto", _mem("text", 23.5, 0.9), vae, 23 * GIB)  # Gemma-3 12B in bf16: the weights alone
    msg = str(err.value)
    assert "models.text" in msg and "23.50 GiB" in msg and "models.text.quantize: int8" in msg
    assert "models.vae" not in msg.split("does not fit")[0]
    huge = decide("auto", text, _mem("vae", 2.3, 30.0), 23 * GIB)  # the VAE's activations are a guess and it
    assert huge.mode == "text-first" and "fallback" in huge.reason  # tiles when out of memory: not refused
    with pytest.raises(OffloadError, match=r"models.vae \(vae test: 21.00 GiB"):
        decide("auto", _mem("text", 1, 0.1), _mem("vae", 21, 0.1), 23 * GIB)  # its weights: refused
    assert decide("auto", text, vae, None).mode == "off"  # no GPU
    assert decide("auto", None, vae, 23 * GIB).mode == "off"  # no estimate: as before, said why
    assert decide("text-first", None, None, None).mode == "text-first"  # an explicit setting is taken as set


@pytest.mark.slow
def test_the_estimate_counts_the_weights_the_loader_loads():
    from shardsmith.encode.memory_estimate import estimate
    from shardsmith.encode.memory_plan import param_bytes
    from shardsmith.encode.text import load_text_encoder
    from shardsmith.encode.vae import load_vae

    r = recipe_from_dict({"sources": [{"path": "x"}], "geometry": {"buckets": ["64x64x1", "96x64x1"]},
                          "models": {"vae": {"family": "sd", "config": "tiny"},
                                     "text": {"family": "gemma", "config": "tiny", "max_length": 64}},
                          "outputs": [{"format": "precomputed"}]})
    t, v = estimate(r, "text", 4), estimate(r, "vae", 4)
    assert t.param_bytes == param_bytes(load_text_encoder("gemma", config="tiny", max_length=64).model)
    assert v.param_bytes == param_bytes(load_vae("sd", config="tiny").model)
    assert t.per_item_bytes > 0 and v.per_item_bytes > 0 and "96x64x1" in v.what and "estimated" in v.what


# ---------------------------------------------------------------- the recipe and where text-first cannot run


def test_a_bad_setting_is_a_recipe_error_and_a_bare_off_means_off(tmp_path):
    from test_cli_mistakes import assert_message, invoke

    with pytest.raises(RecipeError, match="models.offload"):
        _recipe(tmp_path, "sometimes")
    assert _recipe(tmp_path, False).models.offload == "off"  # YAML's bare off
    recipe = tmp_path / "r.yaml"
    recipe.write_text("sources: [{path: src}]\ngeometry: {buckets: [64x64x1]}\n"
                      "models: {vae: {family: sd}, text: {family: minilm}, device: cpu, offload: later}\n"
                      "outputs: [{format: precomputed}]\n")
    code, out = invoke("build", recipe, "--out", tmp_path / "out")
    assert_message(code, out, "models.offload", "text-first")
    assert not (tmp_path / "out").exists()


def test_text_first_with_several_gpus_is_refused_and_auto_there_is_off(tmp_path):
    r = _recipe(tmp_path, "text-first").model_copy(deep=True)
    r.distribute.gpus = 2
    with pytest.raises(OffloadError, match="--gpus 1"):
        offload.settle(r, Ledger.temporary())
    r.models.offload = "auto"
    ledger = Ledger.temporary()
    assert offload.settle(r, ledger).models.offload == "off"
    assert ledger.get_meta(offload.LEDGER_KEY)["mode"] == "off"


def test_settle_on_the_cpu_is_off_without_asking_a_gpu_and_one_model_has_nothing_to_offload(tmp_path):
    ledger = Ledger.temporary()
    r = offload.settle(_recipe(tmp_path), ledger)
    assert r.models.offload == "off" and "CPU" in ledger.get_meta(offload.LEDGER_KEY)["reason"]
    text_only = recipe_from_dict({"sources": [{"path": "x"}], "models": {"text": {"family": "minilm"},
                                                                         "offload": "text-first"},
                                  "outputs": [{"format": "prompt_wds"}]})
    assert offload.settle(text_only, Ledger.temporary()).models.offload == "off"


# ---------------------------------------------------------------- builds


@pytest.mark.slow
def test_text_first_writes_the_same_bytes_and_frees_the_text_encoder_before_the_vae_is_built(tmp_path, monkeypatch):
    import shardsmith.encode.stage as stage_mod
    from shardsmith.build import build

    src = _data(tmp_path)
    plain = build(_recipe(src, "off"), tmp_path / "off", quiet=True, workers=2)
    loads, text_models = [], []
    load_text, load_vae = stage_mod.load_text_encoder, stage_mod.load_vae

    def text_loaded(*a, **k):
        enc = load_text(*a, **k)
        text_models.append(weakref.ref(enc.model))
        loads.append("text")
        return enc

    def vae_loaded(*a, **k):
        gc.collect()
        loads.append(("vae", [r() is None for r in text_models]))
        return load_vae(*a, **k)

    monkeypatch.setattr(stage_mod, "load_text_encoder", text_loaded)
    monkeypatch.setattr(stage_mod, "load_vae", vae_loaded)
    m = build(_recipe(src, "text-first"), tmp_path / "tf", quiet=True, workers=2)
    assert loads == ["text", ("vae", [True])]  # loaded first, and its weights gone before the VAE was built
    assert _files(tmp_path / "tf") == _files(tmp_path / "off")  # latents, embeddings, stamps: the same bytes
    assert len([k for k in _files(tmp_path / "tf") if k.startswith(".precomputed/conditions/")]) == len(CAPTIONS)
    got = m["models"]["offload"]
    assert got["mode"] == "text-first" and got["setting"] == "text-first"
    # every item's caption and latent_wds's negative prompt (""); each distinct one encoded once
    assert got["text_pass"]["captions"] == len(CAPTIONS) + 1 and got["text_pass"]["encoded"] == 4
    assert plain["models"]["offload"]["mode"] == "off"
    assert m["models"]["text"] == plain["models"]["text"]  # the cache answers as that encoder (manifest, stamps)
    assert not (tmp_path / "tf" / ".shardsmith" / "text_cache").exists()  # removed once the build is complete
    from shardsmith.manifest import model_lines

    line = model_lines(m["models"])[0]
    assert "text encoded first, then freed (models.offload text-first: 4 caption(s) encoded" in line


def test_padded_text_rows_give_the_prompts_alone():
    import torch

    from shardsmith.encode.text import load_text_encoder
    from shardsmith.encode.text_memory import encode_halving

    enc = load_text_encoder("gemma", config="tiny", max_length=16)
    a = encode_halving(enc, ["a red fox", "snow"], rows=5)
    b = enc.encode(["a red fox", "snow"])
    assert a.emb.shape[0] == 2 and len(a.truncated) == 2 and torch.equal(a.mask, b.mask)
    assert torch.allclose(a.emb, b.emb, atol=1e-6)


@pytest.mark.slow
def test_text_first_keeps_ltx2s_audio_prompt_embeddings(tmp_path):
    """LTX-2's text encoder makes video and audio prompt embeddings: the cache keeps both, bit for bit."""
    import torch

    from shardsmith.build import build

    src = _data(tmp_path)
    ltx2 = {"family": "ltx2", "config": "tiny"}
    build(_recipe(src, "off", text=ltx2), tmp_path / "off", quiet=True, workers=2)
    m = build(_recipe(src, "text-first", text=ltx2), tmp_path / "tf", quiet=True, workers=2)
    assert m["models"]["offload"]["text_pass"]["encoded"] == 4
    got = _files(tmp_path / "tf")
    assert got == _files(tmp_path / "off")
    cond = torch.load(tmp_path / "tf" / next(k for k in got if "/conditions/" in k), weights_only=True)
    assert {"video_prompt_embeds", "audio_prompt_embeds", "prompt_attention_mask"} <= set(cond)


@pytest.mark.slow
def test_text_first_on_padded_batches_as_on_a_gpu_writes_the_same_bytes(tmp_path, monkeypatch):
    """On a GPU every text batch is padded to the stage's batch size (one shape: the same bits whatever the
    batch-mates); the text pass pads its batches the same way."""
    from shardsmith.build import build
    from shardsmith.encode import text_memory
    from shardsmith.encode.stage import EncodeStage

    monkeypatch.setattr(EncodeStage, "pad_batches", True)
    shapes = []
    encode = text_memory.encode_halving

    def spy(encoder, prompts, **kw):
        shapes.append(len(prompts) if kw.get("rows") is None else max(len(prompts), kw["rows"]))
        return encode(encoder, prompts, **kw)

    for mod in ("shardsmith.encode.stage", "shardsmith.encode.caption_cache", "shardsmith.encode.text_pass"):
        monkeypatch.setattr(f"{mod}.encode_halving", spy)
    src = _data(tmp_path)
    build(_recipe(src, "off"), tmp_path / "off", quiet=True, workers=2)
    build(_recipe(src, "text-first"), tmp_path / "tf", quiet=True, workers=2)
    assert shapes and set(shapes) == {2}  # models.batch_size 2: every text batch, both builds
    assert _files(tmp_path / "tf") == _files(tmp_path / "off")


@pytest.mark.slow
def test_auto_settles_by_the_free_memory_keeps_its_decision_on_resume_and_reuses_the_cache(tmp_path, monkeypatch):
    import shardsmith.encode.stage as stage_mod
    from shardsmith.build import build

    src = _data(tmp_path)
    out = tmp_path / "out"
    # a GPU with this much free (the CPU build asks the same arithmetic): the two do not fit together
    monkeypatch.setattr(offload, "free_bytes", lambda device: 1 << 30)
    monkeypatch.setattr("shardsmith.encode.memory_estimate.estimate",
                        lambda recipe, name, batch: _mem(name, 0.3, 0.2))  # together 1.0 > 0.9, alone 0.5
    calls = {"n": 0}
    complete = stage_mod.EncodeStage._complete

    def crash_on_second(self, p):
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("killed mid-build")
        return complete(self, p)

    monkeypatch.setattr(stage_mod.EncodeStage, "_complete", crash_on_second)
    with pytest.raises(RuntimeError, match="killed mid-build"):
        build(_recipe(src), out, quiet=True, workers=2)
    kept = Ledger.peek(out / ".shardsmith" / "ledger.sqlite", offload.LEDGER_KEY)[0]
    assert kept["mode"] == "text-first" and kept["setting"] == "auto" and kept["free_bytes"] == 1 << 30
    assert (out / ".shardsmith" / "text_cache" / "index.sqlite").exists()
    monkeypatch.setattr(stage_mod.EncodeStage, "_complete", complete)
    monkeypatch.setattr(offload, "free_bytes", lambda device: 1 << 40)  # now everything would fit ...
    m = build(_recipe(src), out, quiet=True, workers=2)
    got = m["models"]["offload"]
    assert got["mode"] == "text-first" and got["setting"] == "auto"  # ... but the build resumes as it began
    assert got["text_pass"]["encoded"] == 0 and got["text_pass"]["cached_before"] == 4  # the cache, reused
    fresh = build(_recipe(src, "off"), tmp_path / "ref", quiet=True, workers=2)
    assert fresh["models"]["offload"]["mode"] == "off"
    assert _files(out) == _files(tmp_path / "ref")


@pytest.mark.slow
def test_auto_refuses_a_text_encoder_that_fits_not_even_alone_with_exit_2_before_any_model(tmp_path, monkeypatch):
    import yaml

    import shardsmith.encode.stage as stage_mod
    from test_cli_mistakes import assert_message, invoke

    _data(tmp_path)
    monkeypatch.setattr(offload, "free_bytes", lambda device: 8 << 30)
    monkeypatch.setattr("shardsmith.encode.memory_estimate.estimate",
                        lambda recipe, name, batch: _mem(name, 23.5 if name == "text" else 0.3, 0.1))

    def never(*a, **k):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(stage_mod, "load_text_encoder", never)
    monkeypatch.setattr(stage_mod, "load_vae", never)
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump({"sources": [{"path": "src"}], "geometry": {"buckets": ["64x64x1"]},
                                      "models": {"vae": {"family": "sd"}, "text": {"family": "minilm"},
                                                 "device": "cpu"},
                                      "outputs": [{"format": "precomputed"}]}))
    code, out = invoke("build", recipe, "--out", tmp_path / "out", "--no-report")
    assert_message(code, out, "models.offload auto", "models.text", "23.50 GiB", "does not fit",
                   "models.text.quantize: int8")


def test_the_cache_gives_back_the_bits_it_was_given(tmp_path):
    import torch

    from shardsmith.encode.text import TextEmbeddings
    from shardsmith.encode.text_cache import CachedText, TextCache, TextCacheMiss

    cache = TextCache(tmp_path / "c", {"model": "a"})
    emb = torch.randn(3, 5, 4, dtype=torch.bfloat16)
    mask = torch.tensor([[1, 1, 0, 0, 0]] * 3)
    cache.put(["x", "y", "z"], TextEmbeddings(emb=emb, mask=mask))
    assert cache.missing(["x", "w", "w"]) == ["x", "w"]  # buffered, not yet written: still missing
    cache.flush()
    assert cache.missing(["x", "w", "z"]) == ["w"]
    got = CachedText(None, None, cache).encode(["z", "x", "z"])
    assert torch.equal(got.emb, emb[[2, 0, 2]]) and got.emb.dtype == torch.bfloat16
    assert torch.equal(got.mask, mask[[2, 0, 2]])
    with pytest.raises(TextCacheMiss, match="did not encode"):
        cache.get(["never"])
    cache.close()
    assert len(TextCache(tmp_path / "c", {"model": "a"})) == 3  # kept across runs ...
    assert len(TextCache(tmp_path / "c", {"model": "b"})) == 0  # ... for the same encoder only


def test_the_decision_round_trips_through_the_ledger_record():
    d = OffloadDecision("text-first", "auto", "why", 1, 2, 3, 4, text_pass={"encoded": 1})
    assert OffloadDecision.from_record(d.record()) == d and "text_pass" not in d.record()
    assert d.line().startswith("offload text-first (models.offload auto): why")
