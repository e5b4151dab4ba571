"""The ``ltx2`` text encoder: LTX-2's conditions (Gemma 3 hidden states of all layers through LTX-2's
feature extractor), as the LTX-2 trainer's ``process_captions.py`` caches them."""

from __future__ import annotations

import hashlib
import json
import math

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("diffusers")

from shardsmith.encode.ltx2_text import (  # noqa: E402
    LTX2FeatureExtractor,
    LTX2TextEncoder,
    feature_dims,
    norm_v1,
    norm_v2,
    pretrained_feature_dims,
)
from shardsmith.encode.text import load_text_encoder  # noqa: E402

L = 1024
PROMPTS = ["a photo of a cat", "  a red bicycle leaning on a brick wall at dusk  ", ""]


@pytest.fixture(scope="module")
def v1():
    return load_text_encoder("ltx2", config="tiny")


@pytest.fixture(scope="module")
def v2():
    return load_text_encoder("ltx2", config="tiny-v2")


def _real_and_pad(mask_row: torch.Tensor) -> tuple[slice, slice, int]:
    n = int(mask_row.sum())
    return slice(L - n, L), slice(0, L - n), n


def test_v1_contract(v1):
    spec = v1.spec
    assert (spec.family, spec.max_length, spec.padding_side, spec.dim, spec.audio_dim) == ("ltx2", L, "left", 32, 32)
    assert spec.features == "ltx2-v1" and spec.zero_padding is True and spec.pooled_dim is None
    assert json.loads(json.dumps(spec.to_dict()))["features"] == "ltx2-v1"
    prov = v1.provenance
    assert prov.weights == "random-weights" and prov.tokenizer == "minilm-wordpiece (stand-in)" and prov.seed == 0
    assert json.loads(json.dumps(prov.to_dict()))["weights"] == "random-weights"

    out = v1.encode(PROMPTS)
    assert out.emb.shape == (3, L, 32) and out.emb.dtype == torch.float32
    assert out.audio_emb is out.emb  # V1: the same tensor is video_prompt_embeds and audio_prompt_embeds
    assert out.mask.shape == (3, L) and out.mask.dtype == torch.int64
    assert set(out.mask.unique().tolist()) <= {0, 1} and out.pooled is None and out.truncated == [False] * 3
    assert torch.isfinite(out.emb).all()
    bos = v1.tokenizer.bos_token_id
    ids, _, _ = v1.tokenize(PROMPTS)
    for i, p in enumerate(PROMPTS):
        real, pad, n = _real_and_pad(out.mask[i])
        assert n == 1 + len(v1.tokenizer(p.strip())["input_ids"])  # BOS + the prompt, no EOS
        assert out.mask[i, real].all() and not out.mask[i, pad].any()  # left padding
        assert ids[i, L - n] == bos and (ids[i, :L - n] == v1.tokenizer.pad_token_id).all()
        assert torch.count_nonzero(out.emb[i, pad]) == 0
        assert torch.count_nonzero(out.emb[i, real]) > 0


def test_v2_contract(v2):
    spec = v2.spec
    assert (spec.dim, spec.audio_dim, spec.features, spec.zero_padding) == (64, 32, "ltx2-v2", False)
    out = v2.encode(PROMPTS[:2])
    assert out.emb.shape == (2, L, 64) and out.audio_emb.shape == (2, L, 32)
    assert out.audio_emb is not out.emb and out.audio_emb.dtype == out.emb.dtype == torch.float32
    fe = v2.features
    for i in range(2):
        real, pad, n = _real_and_pad(out.mask[i])
        # a padded position is normalised to 0 and projected: LTX caches each projection's bias there
        assert torch.equal(out.emb[i, pad], fe.video_text_proj_in.bias.expand(L - n, -1))
        assert torch.equal(out.audio_emb[i, pad], fe.audio_text_proj_in.bias.expand(L - n, -1))
    assert not torch.equal(out.emb[0, -1, :32], out.audio_emb[0, -1])


def test_bfloat16_and_output_device(v1):
    enc = load_text_encoder("ltx2", config="tiny-v2", dtype="bfloat16")
    assert enc.spec.dtype == "bfloat16"
    out = enc.encode(PROMPTS[:1], device="cpu")
    assert out.emb.dtype == out.audio_emb.dtype == torch.bfloat16 and out.mask.dtype == torch.int64
    assert torch.isfinite(out.emb.float()).all()
    again = v1.encode(PROMPTS[:1], device="cpu")
    assert again.audio_emb is again.emb and again.emb.device.type == "cpu"
    with pytest.raises(TypeError):
        v1.encode("a single string")
    with pytest.raises(ValueError):
        v1.encode([])


def test_prompt_independent_of_batch_mates_and_padding(v1, v2):
    for enc in (v1, v2):
        batch = enc.encode(PROMPTS + ["word " * 200])  # a long batch-mate: another window, another forward
        for i, p in enumerate(PROMPTS):
            alone = enc.encode([p])
            assert torch.equal(alone.mask[0], batch.mask[i])
            assert torch.allclose(alone.emb[0], batch.emb[i], atol=1e-6, rtol=0)
            assert torch.allclose(alone.audio_emb[0], batch.audio_emb[i], atol=1e-6, rtol=0)
    # another padding amount (max_length 64): the prompt sits at other absolute positions (LTX's: the last
    # ones), which rotary embeddings make a rounding-level difference only (float32 RoPE at ~1000 vs ~50)
    short = load_text_encoder("ltx2", config="tiny", max_length=64)
    a, b = v1.encode(PROMPTS[:2]), short.encode(PROMPTS[:2])
    for i in range(2):
        n = int(a.mask[i].sum())
        assert int(b.mask[i].sum()) == n and b.emb.shape == (2, 64, 32)
        assert torch.allclose(a.emb[i, -n:], b.emb[i, -n:], atol=5e-5, rtol=0)


def test_tokenize_forces_bos_strips_and_truncates(v1):
    from tokenizers import Tokenizer
    from tokenizers.processors import TemplateProcessing
    from transformers import PreTrainedTokenizerFast

    tok = v1.tokenizer
    bos = tok.bos_token_id
    ids, mask, trunc = v1.tokenize(["", "  a cat ", "a cat", "word " * 1100])
    assert int(mask[0].sum()) == 1 and ids[0, -1] == bos  # an empty prompt is BOS alone
    assert torch.equal(ids[1], ids[2])  # stripped, as LTX and diffusers do
    assert trunc == [False, False, False, True] and mask[3].all() and ids[3, 0] == bos
    assert (ids[3, 1:] == tok("word")["input_ids"][0]).all()

    # a tokenizer that adds BOS itself (as Gemma 3's does) gets no second one
    backend = Tokenizer.from_str(tok.backend_tokenizer.to_str())
    backend.post_processor = TemplateProcessing(single="[CLS] $A", pair="[CLS] $A $B", special_tokens=[("[CLS]", bos)])
    gemma_like = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="[CLS]", eos_token="[SEP]",
                                        pad_token="[PAD]", unk_token="[UNK]")
    assert gemma_like("a cat")["input_ids"][0] == bos
    other = LTX2TextEncoder(v1.spec, v1.provenance, v1.model, gemma_like, v1.features)
    ids2, mask2, trunc2 = other.tokenize(["", "  a cat ", "a cat", "word " * 1100])
    assert torch.equal(ids2, ids) and torch.equal(mask2, mask) and trunc2 == trunc


# Hand-computed normalisation: one prompt, T = 3 (one padded + two real tokens), D = 2, 2 layers.
# encoded[t, d, l]; the padded token holds large values that must not leak anywhere.
LAYER0 = [[1.0, 3.0], [5.0, 7.0]]  # tokens 1, 2 x dims 0, 1
LAYER1 = [[2.0, 2.0], [2.0, 6.0]]


def _hand_input() -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.empty(1, 3, 2, 2)
    x[0, 0] = torch.tensor([[1e4, -1e4], [3e3, 7e3]])  # padding
    x[0, 1:, :, 0] = torch.tensor(LAYER0)
    x[0, 1:, :, 1] = torch.tensor(LAYER1)
    return x, torch.tensor([[0, 1, 1]])


def test_normalisation_by_hand():
    x, mask = _hand_input()
    # V1, per layer over the 2 valid tokens x 2 dims: layer 0 mean 16/4 = 4, range 7 - 1 = 6 -> 8 (x - 4) / 6;
    # layer 1 mean 12/4 = 3, range 6 - 2 = 4 -> 2 (x - 3). Flattened index d * layers + l.
    v1_expected = torch.tensor([[[0.0, 0.0, 0.0, 0.0],
                                 [-4.0, -2.0, -4 / 3, -2.0],
                                 [4 / 3, -2.0, 4.0, 6.0]]])
    assert torch.allclose(norm_v1(x, mask), v1_expected, atol=1e-5, rtol=0)
    # V2, per token and layer: x / sqrt(mean_d x^2 + 1e-6): [1, 3] / sqrt(5), [5, 7] / sqrt(37), [2, 2] / 2,
    # [2, 6] / sqrt(20)
    r5, r37, r20 = math.sqrt(5), math.sqrt(37), math.sqrt(20)
    v2_expected = torch.tensor([[[0.0, 0.0, 0.0, 0.0],
                                 [1 / r5, 1.0, 3 / r5, 1.0],
                                 [5 / r37, 2 / r20, 7 / r37, 6 / r20]]])
    assert torch.allclose(norm_v2(x, mask), v2_expected, atol=1e-5, rtol=0)

    # the extractors: V1 projects with text_proj_in (no bias), the same tensor for audio
    fe1 = LTX2FeatureExtractor("v1", 2, 2)
    w = torch.tensor([[1.0, 0.0, 0.0, 0.0], [0.0, 1.0, 1.0, 1.0]])
    with torch.no_grad():
        fe1.text_proj_in.weight.copy_(w)
    video, audio = fe1(x, mask)
    assert audio is video and fe1.text_proj_in.bias is None
    assert torch.allclose(video, v1_expected @ w.T, atol=1e-5, rtol=0)
    assert torch.equal(video[0, 0], torch.zeros(2))
    # the hidden states as a tuple of layers (what transformers returns) give the same
    assert torch.equal(fe1((x[..., 0], x[..., 1]), mask)[0], video)

    # V2 scales by sqrt(out_dim / D) before each projection: video 4 -> sqrt(2), audio 2 -> 1
    fe2 = LTX2FeatureExtractor("v2", 2, 2, video_dim=4, audio_dim=2)
    with torch.no_grad():
        fe2.video_text_proj_in.weight.copy_(torch.eye(4))
        fe2.video_text_proj_in.bias.copy_(torch.tensor([0.5, 0.0, 0.0, -0.5]))
        fe2.audio_text_proj_in.weight.copy_(w)
        fe2.audio_text_proj_in.bias.zero_()
    video, audio = fe2(x, mask)
    assert torch.allclose(video, v2_expected * math.sqrt(2) + torch.tensor([0.5, 0.0, 0.0, -0.5]), atol=1e-5, rtol=0)
    assert torch.allclose(audio, v2_expected @ w.T, atol=1e-5, rtol=0)
    assert torch.equal(video[0, 0], fe2.video_text_proj_in.bias)  # padded row: the bias


def test_v1_mean_is_float32_as_ltx():
    """LTX's V1 mean divides a bf16 sum by an integer count + eps, which promotes it to float32:
    the normalised values are float32 until the projection casts them back."""
    x, mask = _hand_input()
    out = norm_v1(x.to(torch.bfloat16), mask)
    assert out.dtype == torch.float32
    assert norm_v2(x.to(torch.bfloat16), mask).dtype == torch.bfloat16
    fe = LTX2FeatureExtractor("v1", 2, 2).to(torch.bfloat16)
    assert fe(x.to(torch.bfloat16), mask)[0].dtype == torch.bfloat16


def test_seeded_like_text_py(v1, v2):
    """The Gemma of ``ltx2`` tiny is ``gemma`` tiny's (same config, same seeded construction); the
    projection is seeded too, so every load gives the same weights."""
    gemma = load_text_encoder("gemma")
    ref = gemma.model.state_dict()
    got = v1.model.state_dict()
    assert ref.keys() == got.keys() and all(torch.equal(ref[k], got[k]) for k in ref)
    assert all(torch.equal(a, b) for a, b in zip(v1.model.state_dict().values(), v2.model.state_dict().values()))
    again = load_text_encoder("ltx2", config="tiny-v2")
    for k, t in v2.features.state_dict().items():
        assert torch.equal(t, again.features.state_dict()[k]), k


def test_configs_and_dims():
    assert feature_dims("tiny") == (32, 32) and feature_dims("tiny-v2") == (64, 32)
    assert feature_dims("published") == (3840, 3840) and feature_dims("published-v2") == (4096, 2048)
    assert feature_dims({"base": "published", "audio": False}) == (3840, None)
    assert feature_dims({"features": "v2"}) == (4096, 2048)  # LTX's configurator defaults
    with pytest.raises(ValueError, match="unknown ltx2 text config"):
        load_text_encoder("ltx2", config="huge")
    with pytest.raises(ValueError, match="keys"):
        feature_dims({"hidden": 3})
    with pytest.raises(ValueError, match="V2 settings"):
        feature_dims({"video_dim": 8})
    with pytest.raises(ValueError, match="hidden_states"):
        load_text_encoder("ltx2", hidden_states="mean_all")

    enc = load_text_encoder("ltx2", config={"base": "tiny-v2", "audio": False, "video_dim": 16})
    assert (enc.spec.dim, enc.spec.audio_dim) == (16, None)
    out = enc.encode(["a cat"])
    assert out.emb.shape == (1, L, 16) and out.audio_emb is None
    assert enc.provenance.config_name == "custom"


def test_published_sizes_on_meta():
    """The published architectures (Gemma 3 12B + LTX-2's V1 / LTX-2.3's V2 projection), built on the
    meta device: no memory, the real parameter counts."""
    enc = load_text_encoder("ltx2", config="published-v2", dtype="bfloat16", device="meta")
    c = enc.model.config
    assert (c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads, c.head_dim) == \
        (3840, 48, 16, 8, 256)
    assert c.layer_types.count("full_attention") == 8 and c.sliding_window == 1024
    assert c.rope_parameters["full_attention"] == {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0}
    assert 11.7e9 < sum(p.numel() for p in enc.model.parameters()) < 11.8e9
    fe = enc.features
    assert fe.video_text_proj_in.weight.shape == (4096, 3840 * 49) and fe.audio_text_proj_in.weight.shape == (
        2048, 3840 * 49)
    assert fe.video_text_proj_in.bias is not None
    assert {p.device.type for p in fe.parameters()} == {"meta"} and enc.spec.dtype == "bfloat16"
    assert (enc.spec.dim, enc.spec.audio_dim, enc.spec.features) == (4096, 2048, "ltx2-v2")
    v1 = load_text_encoder("ltx2", config="published", device="meta")
    assert v1.features.text_proj_in.weight.shape == (3840, 3840 * 49) and v1.features.text_proj_in.bias is None
    assert (v1.spec.dim, v1.spec.audio_dim) == (3840, 3840)


def _save_diffusers_folder(enc, root):
    """A diffusers-format LTX-2 folder holding ``enc``: text_encoder/, tokenizer/, connectors/ (an
    LTX2TextConnectors whose projection is ``enc``'s; its connector blocks are small and unused here)."""
    from diffusers.pipelines.ltx2 import LTX2TextConnectors

    fe = enc.features
    v2 = fe.version == "v2"
    a_dim = fe.audio_dim or fe.video_dim
    conn = LTX2TextConnectors(
        caption_channels=fe.hidden_size, text_proj_in_factor=fe.num_layers,
        video_connector_num_attention_heads=2, video_connector_attention_head_dim=fe.video_dim // 2,
        video_connector_num_layers=1, video_connector_num_learnable_registers=None,
        audio_connector_num_attention_heads=2, audio_connector_attention_head_dim=a_dim // 2,
        audio_connector_num_layers=1, audio_connector_num_learnable_registers=None,
        per_modality_projections=v2, video_hidden_dim=fe.video_dim, audio_hidden_dim=a_dim, proj_bias=v2,
    )
    missing, unexpected = conn.load_state_dict(fe.state_dict(), strict=False)
    assert not unexpected and not any("proj_in" in k for k in missing)
    enc.model.save_pretrained(root / "text_encoder")
    enc.tokenizer.save_pretrained(root / "tokenizer")
    conn.save_pretrained(root / "connectors")
    return conn


@pytest.mark.parametrize("config", ["tiny", "tiny-v2"])
def test_from_pretrained_round_trip(tmp_path, config):
    enc = load_text_encoder("ltx2", config=config)
    _save_diffusers_folder(enc, tmp_path)
    again = load_text_encoder("ltx2", pretrained=str(tmp_path))
    prov = again.provenance
    assert prov.weights == "pretrained" and prov.path_or_repo == str(tmp_path)
    assert prov.tokenizer == f"{tmp_path}/tokenizer"
    te = tmp_path / "text_encoder" / "model.safetensors"
    cn = tmp_path / "connectors" / "diffusion_pytorch_model.safetensors"
    assert prov.weight_files == ["text_encoder/model.safetensors", "connectors/diffusion_pytorch_model.safetensors"]
    assert prov.weights_sha256 == hashlib.sha256(te.read_bytes() + cn.read_bytes()).hexdigest()
    assert json.loads(json.dumps(prov.to_dict()))["config"]["connectors"]["text_proj_in_factor"] == 3
    for key in ("dim", "audio_dim", "features", "max_length", "padding_side", "zero_padding"):
        assert getattr(again.spec, key) == getattr(enc.spec, key), key
    assert pretrained_feature_dims(str(tmp_path)) == (enc.spec.dim, enc.spec.audio_dim)
    a, b = enc.encode(PROMPTS), again.encode(PROMPTS)
    assert torch.equal(a.mask, b.mask) and torch.equal(a.emb, b.emb) and torch.equal(a.audio_emb, b.audio_emb)
    assert a.truncated == b.truncated


def test_pretrained_mismatch_is_refused(tmp_path):
    """Connectors made for another text encoder (hidden states count) are refused at load."""
    enc = load_text_encoder("ltx2", config={"gemma": {"num_hidden_layers": 3}})
    assert enc.features.num_layers == 4
    _save_diffusers_folder(load_text_encoder("ltx2", config="tiny"), tmp_path)
    enc.model.save_pretrained(tmp_path / "text_encoder")
    with pytest.raises(ValueError, match="connectors expect 3 hidden states"):
        load_text_encoder("ltx2", pretrained=str(tmp_path))


def test_pretrained_gemma3_for_conditional_generation(tmp_path):
    """A real diffusers LTX-2 folder's text_encoder/ is a Gemma3ForConditionalGeneration (vision tower
    included): it loads as Gemma3Model, whose text hidden states are the language model's."""
    import transformers as tf

    enc = load_text_encoder("ltx2", config="tiny")
    _save_diffusers_folder(enc, tmp_path)
    vision = tf.SiglipVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                                   image_size=28, patch_size=14)
    cfg = tf.Gemma3Config(text_config=enc.model.config.to_dict(), vision_config=vision.to_dict(), mm_tokens_per_image=4,
                          image_token_index=30521, boi_token_index=30520, eoi_token_index=30519)
    full = tf.Gemma3ForConditionalGeneration(cfg)
    full.model.language_model.load_state_dict(enc.model.state_dict(), strict=True)
    full.save_pretrained(tmp_path / "text_encoder")
    again = load_text_encoder("ltx2", pretrained=str(tmp_path))
    assert type(again.model).__name__ == "Gemma3Model" and again.provenance.weights == "pretrained"
    a, b = enc.encode(PROMPTS), again.encode(PROMPTS)
    assert torch.equal(a.emb, b.emb) and torch.equal(a.mask, b.mask)
