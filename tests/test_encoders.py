"""Encode stage: diffusers VAEs (tiny random configs) and text encoders (real MiniLM,
tiny random T5 / umT5 / CLIP / Gemma). CPU only, no network."""

from __future__ import annotations

import hashlib
import json
import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")
pytest.importorskip("transformers")

from shardsmith.encode import (  # noqa: E402
    ENCODERS,
    EncoderSpec,
    Provenance,
    VaeEncoder,
    families,
    load_encoder,
    load_text_encoder,
    load_vae,
    vae_geometry,
)

IMAGE = ["sd", "sdxl", "flux"]
VIDEO = ["wan", "ltx", "ltx2"]
EXPECTED = {  # family: (channels, spatial, temporal)
    "sd": (4, 8, 1), "sdxl": (4, 8, 1), "flux": (16, 8, 1),
    "wan": (16, 8, 4), "ltx": (128, 32, 8), "ltx2": (128, 32, 8),
}


def _pixels(shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(shape, generator=g) * 2 - 1


_CACHE: dict[str, tuple] = {}


def _encoded(family):
    """(encoder, x, z, raw posterior mean) computed once per family."""
    if family not in _CACHE:
        enc = load_vae(family)
        x = _pixels((1, 3, 64, 64) if family in IMAGE else (1, 3, 9, 64, 64))
        z = enc.encode(x)
        raw = enc.posterior(x).mean
        _CACHE[family] = (enc, x, z, raw)
    return _CACHE[family]


# ----------------------------------------------------------------------------- VAEs


@pytest.mark.parametrize("family", IMAGE + VIDEO)
def test_vae_encode_shape_dtype_provenance(family):
    enc, x, z, _ = _encoded(family)
    C, s, t = EXPECTED[family]
    assert (enc.spec.latent_channels, enc.spec.spatial, enc.spec.temporal) == (C, s, t)
    if family in IMAGE:
        assert enc.spec.kind == "image_vae"
        expected = (1, C, 64 // s, 64 // s)
    else:
        assert enc.spec.kind == "video_vae"
        expected = (1, C, 1 + (9 - 1) // t, 64 // s, 64 // s)  # wan: F'=3, ltx: F'=2
    # compression derived from the config agrees with what the model really does
    assert tuple(z.shape) == expected
    assert enc.latent_shape(x.shape[1:]) == expected[1:]
    assert z.dtype == torch.float32 and torch.isfinite(z).all()
    assert vae_geometry(family, "tiny") == {"kind": enc.spec.kind, "latent_channels": C, "spatial": s, "temporal": t}

    prov = enc.provenance
    assert prov.weights == "random-weights" and prov.is_random
    assert prov.weights_sha256 is None and prov.config_name == "tiny" and prov.seed == 0
    d = json.loads(json.dumps(prov.to_dict()))
    assert d["weights"] == "random-weights" and d["cls"] == type(enc.model).__name__
    sd = json.loads(json.dumps(enc.spec.to_dict()))
    assert sd["store"] == "mean" and "max_length" not in sd


@pytest.mark.parametrize("family", IMAGE + VIDEO)
def test_vae_normalisation_applied(family):
    enc, _, z, raw = _encoded(family)
    cfg = enc.model.config
    raw = raw.float()
    if family in IMAGE:
        scale = {"sd": 0.18215, "sdxl": 0.13025, "flux": 0.3611}[family]
        shift = {"sd": 0.0, "sdxl": 0.0, "flux": 0.1159}[family]
        assert cfg.scaling_factor == pytest.approx(scale)
        assert enc.spec.normalisation == {"type": "scale_shift", "scale": pytest.approx(scale), "shift": pytest.approx(shift)}
        manual = (raw - shift) * scale
    elif family == "wan":
        mean = torch.tensor(cfg.latents_mean).view(1, -1, 1, 1, 1)
        std = torch.tensor(cfg.latents_std).view(1, -1, 1, 1, 1)
        manual = (raw - mean) / std
    else:  # ltx / ltx2: buffers + config scaling_factor, as diffusers' LTX pipelines
        mean = enc.model.latents_mean.view(1, -1, 1, 1, 1)
        std = enc.model.latents_std.view(1, -1, 1, 1, 1)
        manual = (raw - mean) * cfg.scaling_factor / std
        assert not torch.allclose(std, torch.ones_like(std))  # tiny stats are non-trivial
    assert torch.allclose(z, manual, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(z, raw, atol=1e-3)


@pytest.mark.parametrize("family", IMAGE + VIDEO)
def test_vae_decode_returns_pixels(family):
    enc, x, z, _ = _encoded(family)
    y = enc.decode(z)
    assert y.shape == x.shape and y.dtype == torch.float32
    assert y.min() >= -1.0 and y.max() <= 1.0 and torch.isfinite(y).all()


@pytest.mark.parametrize("family", ["sd", "wan", "ltx"])
def test_vae_store_mean_std_is_raw_edm2_layout(family):
    enc = load_vae(family, store="mean_std")
    x = _pixels({"sd": (2, 3, 32, 32), "wan": (1, 3, 5, 16, 16), "ltx": (1, 3, 9, 32, 32)}[family], seed=1)
    out = enc.encode(x)
    C = enc.spec.latent_channels
    assert enc.spec.stored_channels == 2 * C and out.shape[1] == 2 * C
    assert enc.latent_shape(x.shape[1:]) == tuple(out.shape[1:])
    post = enc.posterior(x)  # the model's raw posterior
    assert torch.allclose(out[:, :C], post.mean, atol=1e-6)  # unnormalised mean
    assert torch.allclose(out[:, C:], post.std, atol=1e-6) and (out[:, C:] > 0).all()
    if family == "ltx":
        assert enc.decode(out).shape == x.shape  # decodes the mean half


def test_vae_store_sample_is_seeded():
    from shardsmith.encode import normalise

    enc = load_vae("sd", store="sample")
    x = _pixels((1, 3, 16, 16), seed=2)
    a, b = enc.encode(x), enc.encode(x)
    assert torch.equal(a, b)  # default generator is seeded
    c = enc.encode(x, generator=torch.Generator().manual_seed(123))
    assert not torch.equal(a, c)
    mean = normalise(enc.posterior(x).mean, enc.spec.normalisation)
    assert a.shape == mean.shape and not torch.allclose(a, mean)


def test_vae_frame_rule_and_geometry_refusals():
    ltx = load_vae("ltx")
    with pytest.raises(ValueError, match=r"8x temporal.*1 \+ 8k.*F=8.*F=1.*F=9"):
        ltx.encode(torch.zeros(1, 3, 8, 64, 64))
    wan = load_vae("wan")
    with pytest.raises(ValueError, match=r"1 \+ 4k"):
        wan.encode(torch.zeros(1, 3, 8, 64, 64))
    with pytest.raises(ValueError, match="multiples of 32"):
        ltx.encode(torch.zeros(1, 3, 9, 48, 64))
    with pytest.raises(ValueError, match=r"video VAE: expected \[B,3,F,H,W\]"):
        ltx.encode(torch.zeros(1, 3, 64, 64))
    sd = load_vae("sd")
    with pytest.raises(ValueError, match=r"image VAE: expected \[B,3,H,W\]"):
        sd.encode(torch.zeros(1, 3, 9, 64, 64))
    with pytest.raises(TypeError, match="float pixels"):
        sd.encode(torch.zeros(1, 3, 64, 64, dtype=torch.uint8))
    with pytest.raises(ValueError, match="1 \\+ 8k"):
        ltx.latent_shape((3, 8, 64, 64))
    assert ltx.latent_shape((3, 33, 512, 512)) == (128, 5, 16, 16)  # the LTX trainer's example


def test_vae_published_geometry_without_building():
    for fam, (C, s, t) in EXPECTED.items():
        g = vae_geometry(fam, "published")
        assert (g["latent_channels"], g["spatial"], g["temporal"]) == (C, s, t), fam


def test_vae_unknown_family_and_config():
    with pytest.raises(ValueError, match="unknown VAE family"):
        load_vae("nope")
    with pytest.raises(ValueError, match="unknown config"):
        load_vae("sd", config="huge")
    with pytest.raises(ValueError, match="store"):
        load_vae("sd", store="mode")


@pytest.mark.parametrize("family", ["sd", "ltx"])
def test_vae_save_pretrained_round_trip(family, tmp_path):
    enc = load_vae(family)
    enc.model.save_pretrained(tmp_path)
    files = sorted(p.name for p in tmp_path.iterdir())
    assert "diffusion_pytorch_model.safetensors" in files
    again = load_vae(family, pretrained=str(tmp_path))
    assert again.provenance.weights == "pretrained"
    expected_sha = hashlib.sha256((tmp_path / "diffusion_pytorch_model.safetensors").read_bytes()).hexdigest()
    assert again.provenance.weights_sha256 == expected_sha
    assert again.provenance.weight_files == ["diffusion_pytorch_model.safetensors"]
    assert json.loads(json.dumps(again.provenance.to_dict()))["weights"] == "pretrained"
    assert again.spec == enc.spec  # incl. LTX latents_mean/std buffers restored from the file
    x = _pixels((1, 3, 64, 64) if family == "sd" else (1, 3, 9, 64, 64), seed=3)
    assert torch.equal(enc.encode(x), again.encode(x))


def test_vae_pretrained_subfolder_and_missing(tmp_path):
    enc = load_vae("sd")
    enc.model.save_pretrained(tmp_path / "vae")
    again = load_vae("sd", pretrained=str(tmp_path), subfolder="vae")
    assert again.provenance.subfolder == "vae" and again.provenance.weights_sha256 is not None
    with pytest.raises(Exception):
        load_vae("sd", pretrained=str(tmp_path / "does-not-exist"))


def test_vae_bfloat16():
    enc = load_vae("ltx", dtype="bfloat16")
    assert enc.spec.dtype == "bfloat16"
    z = enc.encode(_pixels((1, 3, 9, 64, 64)))
    assert z.dtype == torch.bfloat16 and z.shape == (1, 128, 2, 2, 2)


# ----------------------------------------------------------------------------- text


@pytest.fixture(scope="module")
def minilm():
    return load_text_encoder("minilm")


def _mean_pool(emb, mask):
    m = mask.unsqueeze(-1).float()
    return (emb.float() * m).sum(1) / m.sum(1)


def test_minilm_is_real_and_semantic(minilm):
    prov = minilm.provenance
    assert prov.weights == "pretrained" and prov.cls == "BertModel"
    from shardsmith.encode.text import minilm_path

    st = minilm_path() / "model.safetensors"
    assert prov.weights_sha256 == hashlib.sha256(st.read_bytes()).hexdigest()
    assert json.loads(json.dumps(prov.to_dict()))["weights"] == "pretrained"

    prompts = ["a photo of a cat", "a photo of a kitten", "quarterly stock report"]
    out = minilm.encode(prompts)
    assert out.emb.shape == (3, 77, 384) and out.emb.dtype == torch.float32
    assert out.mask.shape == (3, 77) and out.mask.dtype == torch.int64
    assert out.pooled is None and out.truncated == [False] * 3
    for i, p in enumerate(prompts):
        n = len(minilm.tokenizer(p)["input_ids"])  # incl. [CLS]/[SEP]
        assert int(out.mask[i].sum()) == n
        assert out.mask[i, :n].all() and not out.mask[i, n:].any()  # right padding
        assert torch.count_nonzero(out.emb[i, n:]) == 0  # padded positions are zero
        assert torch.count_nonzero(out.emb[i, :n]) > 0
    v = torch.nn.functional.normalize(_mean_pool(out.emb, out.mask), dim=-1)
    cat_kitten, cat_stock = float(v[0] @ v[1]), float(v[0] @ v[2])
    assert cat_kitten > cat_stock + 0.2, (cat_kitten, cat_stock)


def test_minilm_max_length_and_truncation():
    enc = load_text_encoder("minilm", max_length=16)
    assert enc.spec.max_length == 16 and enc.spec.padding_side == "right"
    out = enc.encode(["word " * 40, ""])
    assert out.emb.shape == (2, 16, 384)
    assert out.truncated == [True, False]
    assert out.mask[0].all() and int(out.mask[1].sum()) == 2  # [CLS] [SEP]
    with pytest.raises(TypeError):
        enc.encode("not a list")
    with pytest.raises(ValueError, match="positions"):
        load_text_encoder("clip", max_length=100)  # CLIP has 77 positions


TINY_TEXT = {  # family: (L, padding side, pooled)
    "t5": (512, "right", False),
    "umt5": (512, "right", False),
    "clip": (77, "right", True),
    "gemma": (1024, "left", False),
}


@pytest.mark.parametrize("family", list(TINY_TEXT))
def test_tiny_text_encoders(family):
    L, side, pooled = TINY_TEXT[family]
    enc = load_text_encoder(family)
    assert enc.spec.max_length == L and enc.spec.padding_side == side and enc.spec.dim == 32
    prov = enc.provenance
    assert prov.weights == "random-weights" and prov.tokenizer == "minilm-wordpiece (stand-in)"
    d = json.loads(json.dumps(prov.to_dict()))
    assert d["weights"] == "random-weights" and d["tokenizer"] == "minilm-wordpiece (stand-in)"
    assert json.loads(json.dumps(enc.spec.to_dict()))["kind"] == "text"

    prompts = ["a photo of a cat", "a red bicycle leaning on a brick wall at dusk"]
    out = enc.encode(prompts)
    assert out.emb.shape == (2, L, 32) and out.mask.shape == (2, L) and out.mask.dtype == torch.int64
    assert torch.isfinite(out.emb).all()
    for i, p in enumerate(prompts):
        n = len(enc.tokenizer(p)["input_ids"])
        assert int(out.mask[i].sum()) == n
        real = slice(L - n, L) if side == "left" else slice(0, n)
        pad = slice(0, L - n) if side == "left" else slice(n, L)
        assert out.mask[i, real].all() and not out.mask[i, pad].any()
        if enc.spec.zero_padding:
            assert torch.count_nonzero(out.emb[i, pad]) == 0
        else:  # CLIP keeps the model's states at padded positions, as SD pipelines do
            assert torch.count_nonzero(out.emb[i, pad]) > 0
    if pooled:
        assert enc.spec.pooled_dim == 32 and out.pooled.shape == (2, 32)
        sep = enc.tokenizer.sep_token_id
        ids, _, _ = enc.tokenize(prompts)
        eos = (ids == sep).int().argmax(-1)
        # pooled = final-layer-normed state at the end-of-text token
        assert torch.allclose(out.pooled, out.emb[torch.arange(2), eos], atol=1e-6)
    else:
        assert out.pooled is None and enc.spec.pooled_dim is None


def test_gemma_left_padding_is_length_invariant():
    long = load_text_encoder("gemma", max_length=96)
    short = load_text_encoder("gemma", max_length=24)
    p = ["a photo of a cat"]
    a, b = long.encode(p), short.encode(p)
    n = int(a.mask.sum())
    assert int(b.mask.sum()) == n
    assert torch.allclose(a.emb[0, -n:], b.emb[0, -n:], atol=1e-5)
    mean_all = load_text_encoder("gemma", max_length=24, hidden_states="mean_all")
    c = mean_all.encode(p)
    assert c.emb.shape == (1, 24, 32) and not torch.allclose(c.emb, b.emb)
    assert torch.count_nonzero(c.emb[0, :-n]) == 0


def test_text_save_pretrained_round_trip(tmp_path):
    enc = load_text_encoder("t5", max_length=32)
    enc.model.save_pretrained(tmp_path)
    enc.tokenizer.save_pretrained(tmp_path)
    again = load_text_encoder("t5", pretrained=str(tmp_path), max_length=32)
    prov = again.provenance
    assert prov.weights == "pretrained" and prov.tokenizer == str(tmp_path)
    assert prov.weights_sha256 == hashlib.sha256((tmp_path / "model.safetensors").read_bytes()).hexdigest()
    p = ["a photo of a cat", "two dogs"]
    assert torch.equal(enc.encode(p).emb, again.encode(p).emb)


def test_random_weights_are_built_on_the_target_device():
    """Random-weight models are allocated and initialised on the target device (here "meta":
    no storage anywhere), never as an fp32 host copy first; the CPU build is unchanged."""
    from shardsmith.encode.vae import SEED, _diffusers_class, resolve_config, seeded_init

    enc = load_text_encoder("t5", config="xxl", dtype="bfloat16", device="meta")  # T5 v1.1 XXL encoder
    c = enc.model.config
    assert (c.d_model, c.d_ff, c.num_layers, c.num_heads, c.d_kv) == (4096, 10240, 24, 64, 64)
    assert {p.device.type for p in enc.model.parameters()} == {"meta"}
    assert {p.dtype for p in enc.model.parameters()} == {torch.bfloat16}
    assert 4.6e9 < sum(p.numel() for p in enc.model.parameters()) < 4.9e9
    prov = enc.provenance
    assert prov.weights == "random-weights" and prov.config_name == "xxl"
    assert any("drawn on meta" in n for n in prov.notes)
    with pytest.raises(ValueError, match="'xxl'"):
        load_text_encoder("t5", config="huge")

    cfg, _ = resolve_config("ltx2", "published")
    with seeded_init("meta"):
        vae = _diffusers_class("ltx2")(**cfg)
    assert {p.device.type for p in vae.parameters()} == {"meta"}

    # CPU: same weights as the plain seeded CPU construction, global RNG untouched
    state = torch.random.get_rng_state()
    enc = load_vae("sd")
    assert torch.equal(torch.random.get_rng_state(), state)
    assert not any("drawn on" in n for n in enc.provenance.notes)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        ref = _diffusers_class("sd")(**resolve_config("sd", "tiny")[0])
    for (k, a), (_, b) in zip(enc.model.state_dict().items(), ref.state_dict().items()):
        assert torch.equal(a, b), k


# ----------------------------------------------------------------------------- registry / spec


def test_registry():
    assert set(families("vae")) == set(IMAGE + VIDEO)
    assert set(families("text")) == {"minilm", "t5", "umt5", "clip", "gemma", "ltx2"}
    assert ("video_vae", "wan") in ENCODERS and ("text", "minilm") in ENCODERS
    assert all(isinstance(v, str) and v for v in ENCODERS.values())
    enc = load_encoder("image_vae", "sdxl")
    assert isinstance(enc, VaeEncoder) and enc.spec.normalisation["scale"] == pytest.approx(0.13025)
    assert load_encoder("vae", "ltx").spec.kind == "video_vae"
    assert load_encoder("text", "clip", max_length=20).spec.max_length == 20
    with pytest.raises(ValueError, match="is a image_vae"):
        load_encoder("video_vae", "sd")
    with pytest.raises(ValueError, match="unknown encoder kind"):
        load_encoder("audio", "sd")
    with pytest.raises(ValueError, match="unknown text encoder"):
        load_encoder("text", "bert-large")


def test_spec_and_provenance_validation():
    with pytest.raises(ValueError):
        EncoderSpec(kind="vae", family="x")
    with pytest.raises(ValueError):
        EncoderSpec(kind="image_vae", family="x", temporal=4)
    with pytest.raises(ValueError, match="entries"):
        EncoderSpec(kind="video_vae", family="x", latent_channels=2,
                    normalisation={"type": "mean_std", "mean": [0.0], "std": [1.0]})
    with pytest.raises(ValueError):
        Provenance(cls="X", weights="trained")
    s = EncoderSpec(kind="video_vae", family="wan", latent_channels=16, spatial=8, temporal=4, store="mean_std")
    assert s.latent_shape((3, 81, 480, 832)) == (32, 21, 60, 104)  # FastGen Wan example, mean||std


def test_vae_pretrained_from_hub_cache_layout(tmp_path):
    """A hub repo id resolved offline from an HF cache (models--org--name/snapshots/<rev>)."""
    rev = "a" * 40
    repo = tmp_path / "models--acme--tiny-sd"
    enc = load_vae("sd")
    enc.model.save_pretrained(repo / "snapshots" / rev / "vae")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(rev)
    again = load_vae("sd", pretrained="acme/tiny-sd", subfolder="vae", cache_dir=str(tmp_path))
    prov = again.provenance
    assert prov.weights == "pretrained" and prov.path_or_repo == "acme/tiny-sd" and prov.revision == rev
    st = repo / "snapshots" / rev / "vae" / "diffusion_pytorch_model.safetensors"
    assert prov.weights_sha256 == hashlib.sha256(st.read_bytes()).hexdigest()
    x = _pixels((1, 3, 16, 16), seed=4)
    assert torch.equal(enc.encode(x), again.encode(x))


def test_hash_pretrained_unknown_repo_records_note(tmp_path):
    from shardsmith.encode.spec import hash_pretrained

    sha, files, _, notes = hash_pretrained("acme/not-cached", cache_dir=str(tmp_path))
    assert sha is None and files == [] and notes and "could not locate" in notes[0]


@pytest.mark.parametrize("family", ["t5", "umt5"])
def test_t5_position_bias_is_contiguous_for_fused_sdpa_and_unchanged(family):
    """transformers builds the relative position bias as a permuted view (last stride = heads);
    SDPA's fused CUDA kernels refuse such a mask and fall back to the float32 math path."""
    from shardsmith.encode.text import load_text_encoder

    enc = load_text_encoder(family, config="tiny", dtype="float32")
    mods = [m for m in enc.model.modules() if getattr(m, "has_relative_attention_bias", False)]
    assert mods and any("position bias made contiguous" in n for n in enc.provenance.notes)
    for m in mods:
        patched = m.compute_bias(20, 20)
        original = type(m).compute_bias(m, 20, 20)
        assert original.stride()[-1] != 1  # what transformers returns
        assert patched.is_contiguous() and torch.equal(patched, original)


def test_text_cache_is_bounded_by_bytes_and_keeps_answers_right():
    from shardsmith.encode.stage import EncodeStage

    enc = load_text_encoder("t5")  # tiny: [L, 32] float32 per caption
    st = EncodeStage(load_vae("sd"), enc, batch_size=2, device="cpu")
    one = enc.spec.max_length * enc.spec.dim * 4 + enc.spec.max_length * 8  # emb + int64 mask bytes
    st.TEXT_CACHE_BYTES = 5 * one
    caps = [f"caption number {i}" for i in range(12)]
    for i in range(0, 12, 3):
        got = st.text(caps[i:i + 3])
        want = enc.encode(caps[i:i + 3])
        for (e, m), we, wm in zip(got, want.emb, want.mask):
            torch.testing.assert_close(e, we)
            assert torch.equal(m, wm)
        assert sum(e.nbytes + m.nbytes for e, m in st._text_cache.values()) <= 6 * one
    assert set(st._text_cache) >= set(caps[9:12])  # the current batch always stays


def test_weight_files_are_read_once_per_process_unless_they_change(tmp_path, monkeypatch):
    # a compiled build looks its pretrained VAE's hash up for the packages, then loads the model, whose provenance
    # hashes the same files: gigabytes of weights must not be read twice; a file changed since is read again
    import os

    from shardsmith.encode import spec

    a, b = tmp_path / "b.safetensors", tmp_path / "a.safetensors"
    a.write_bytes(b"first file")
    b.write_bytes(b"second")
    reads = []
    real = spec._sha256_bytes
    monkeypatch.setattr(spec, "_sha256_bytes", lambda paths, chunk: reads.append(len(paths)) or real(paths, chunk))
    want = hashlib.sha256(b"second" + b"first file").hexdigest()  # (sorted by name)
    assert spec.sha256_files([a, b]) == spec.sha256_files([str(b), str(a)]) == want
    assert reads == [2]
    a.write_bytes(b"first file, edited")
    os.utime(a, ns=(1, 1))  # (and a change time of its own, whatever the file system's clock resolution)
    assert spec.sha256_files([a, b]) == hashlib.sha256(b"second" + b"first file, edited").hexdigest()
    assert reads == [2, 2]


def test_per_channel_statistics_are_made_once_per_device_with_the_same_latents():
    """LTX-style mean/std normalisation makes its statistics on the latents' device once, not from the recipe's lists
    every batch: on a GPU each such copy made the host wait for the batch's own forward before it could queue
    anything after it (tests/test_gpu_launch.py checks that wait is gone). The arithmetic is unchanged."""
    from shardsmith.encode import vae as vae_mod

    norm = {"type": "mean_std", "mean": [0.5, -1.0, 2.0], "std": [2.0, 0.25, 1.0], "scale": 1.0}
    z = torch.randn(2, 3, 4, 5, generator=torch.Generator().manual_seed(0))
    vae_mod._stats_on.cache_clear()
    made = []
    real = torch.tensor
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(vae_mod.torch, "tensor", lambda *a, **k: (made.append(1), real(*a, **k))[1])
        first, second = vae_mod.normalise(z, norm), vae_mod.normalise(z, norm)
        back = vae_mod.denormalise(first, norm)
    assert len(made) == 2  # mean and std, once
    mean = real(norm["mean"]).view(1, 3, 1, 1)
    std = real(norm["std"]).view(1, 3, 1, 1)
    assert torch.equal(first, (z - mean) / std) and torch.equal(second, first)
    torch.testing.assert_close(back, z)
    # made once, inside inference mode (the packaged encoder normalises there), they still serve a graph with
    # gradients later (a decode that records for backward)
    vae_mod._stats_on.cache_clear()
    with torch.inference_mode():
        vae_mod.normalise(z, norm)
    w = z.clone().requires_grad_(True)
    vae_mod.denormalise(w, norm).sum().backward()
    assert torch.equal(w.grad, std.expand_as(z))
