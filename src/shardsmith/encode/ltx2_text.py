"""LTX-2 text conditions: what the LTX-2 trainer's ``process_captions.py`` caches in ``conditions/``.

``load_ltx2_text_encoder(...)`` (``load_text_encoder("ltx2", ...)``) returns an :class:`LTX2TextEncoder`
whose ``encode(prompts)`` gives :class:`~shardsmith.encode.text.TextEmbeddings` with

* ``emb``       ``[B, 1024, D_v]``: ``video_prompt_embeds``
* ``audio_emb`` ``[B, 1024, D_a]``: ``audio_prompt_embeds`` (None when the model makes no audio features)
* ``mask``      ``[B, 1024]`` int64 0/1: ``prompt_attention_mask``, left padding

The pipeline is LTX-2's (ltx_core ``text_encoders/gemma``): the Gemma 3 text model runs over the
prompt (BOS forced, left padded to 1024 tokens); the hidden states of ALL layers (embedding output
+ every decoder layer, the last one after the final norm, as transformers returns them) are stacked
to ``[B, T, D, layers]``, normalised and projected by the feature extractor ("Blocks 1-2"; the
connectors, Block 3, run at train time and are not applied here):

* V1 (LTX-2 19B, ``FeatureExtractorV1``): per prompt and layer, over the valid tokens and all
  hidden dims, ``8 * (x - mean) / (max - min + 1e-6)``; then ``text_proj_in`` (D*layers -> D, no
  bias). The SAME tensor is the video and the audio features. Padded rows: 0.
* V2 (LTX-2.3 22B, ``FeatureExtractorV2``): per token and layer, ``x * rsqrt(mean(x^2) + 1e-6)``
  over the hidden dims; then, for each of ``video_text_proj_in`` / ``audio_text_proj_in`` (with
  bias), ``* sqrt(out_dim / D)`` and the projection. Padded rows: the projections' biases.

The operations and their dtype order are LTX's (``feature_extractor.py``): V1's mean is float32
(an integer count + eps promotes it), the normalised tensor is cast back to the model dtype before
the projection; V2 runs in the model dtype. Module names are diffusers' ``LTX2TextConnectors``
ones, so a diffusers-format LTX-2 folder loads its real projection weights.

How it runs (the same values as LTX's ``process_captions.py``, at several times its speed):

* Gemma runs over the last ``W`` columns of the left-padded 1024-token layout only, ``W`` the
  smallest of 64 / 128 / 256 / 512 / 1024 that holds the prompt (a batch's prompts are grouped by
  ``W``, one forward a group of at most 16384 tokens), with the position ids those columns have in the full layout
  (``arange(1024 - W, 1024)``, what LTX's Gemma call gets by default). The columns left out are
  padding: no prompt token attends to them and the feature extractor masks them out. A forward
  holds at least 1024 tokens (a small group is filled with repeats of its prompts, whose outputs
  are dropped), so its matrix products are no smaller than LTX's own one-prompt forward.
* The feature extractor runs prompt by prompt on LTX's own input for that prompt, ``[1, 1024, D,
  layers]`` with the prompt's mask (LTX runs one prompt per call too), so its matrix product has
  LTX's shape and padded rows are what LTX writes there (V1: 0; V2: the projections' biases).

Measured on an H200 (torch 2.11, transformers 5.17), random Gemma 3 12B in bf16, V1 and V2: the
output is bitwise LTX's (``LTXGemmaTextEncoder.encode`` + ``FeatureExtractorV1/V2`` per prompt)
and diffusers' (``LTX2Pipeline._get_gemma_prompt_embeds`` + ``LTX2TextConnectors``' projection),
bitwise the same whatever the batch, at 68 (V1) / 86 (V2) prompts/s for 32 prompts of 25-117
tokens against 11-12 for LTX's path. (Bitwise equality across batch shapes is what these kernels
gave there, not a promise of every GPU and library version.)

Configs (random weights, seeded like every random-weight encoder here; the MiniLM WordPiece
vocabulary stands in for Gemma's tokenizer, made to behave like Gemma 3's: no special tokens of its
own, BOS (``[CLS]``) forced as LTX's tokenizer forces it, no EOS):

================  ==================================  =======  =====  ==================
config            Gemma 3 text model                  version  D_v    D_a
================  ==================================  =======  =====  ==================
``tiny``          hidden 32, 2 layers (``gemma``'s)   V1       32     32
``tiny-v2``       hidden 32, 2 layers                 V2       64     32
``published``     Gemma 3 12B (3840, 48 layers)       V1       3840   3840 (LTX-2 19B)
``published-v2``  Gemma 3 12B                         V2       4096   2048 (LTX-2.3 22B)
================  ==================================  =======  =====  ==================

A dict config starts from ``base`` (a name above, default ``tiny``) and overrides ``gemma`` (a dict
merged into the Gemma3TextConfig keywords), ``features`` (``"v1"`` / ``"v2"``), ``video_dim`` /
``audio_dim`` (V2 only) and ``audio`` (False: no audio projection, ``audio_emb`` None).

``pretrained``: a diffusers-format LTX-2 pipeline folder (or hub repo id in the local cache) holding
``text_encoder/`` (``AutoModel``: Gemma3Model of a Gemma3ForConditionalGeneration checkpoint, or a
Gemma3TextModel), ``tokenizer/`` (``AutoTokenizer``) and ``connectors/`` (``LTX2TextConnectors``:
only its projection is kept; ``per_modality_projections`` picks V2).
"""

from __future__ import annotations

import copy
import hashlib
import math
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .spec import EncoderSpec, Provenance, find_weight_files, resolve_model_folder
from .text import STANDIN_TOKENIZER, TINY_CONFIGS, TextEmbeddings, TextEncoder, _standin_tokenizer, to_device, to_pinned
from .vae import SEED, _dtype_name, _torch_dtype, device_init_note, seeded_init

MAX_LENGTH = 1024  # ltx_core gemma_assets.TOKENIZER_MAX_LENGTH
EPS = 1e-6
V1_SCALE = 8
V2_DEFAULT_DIMS = (4096, 2048)  # ltx_core encoder_configurator: 32 x 128 video, 32 x 64 audio
WINDOWS = (64, 128, 256, 512)  # the token windows Gemma runs over (then max_length); see window()
MAX_FORWARD_TOKENS = 16384  # prompts x window of one Gemma forward at most (bounds the stacked hidden states)

# google/gemma-3-12b text_config (the LTX-2 / LTX-2.3 text encoder), transformers 5 keywords.
GEMMA3_12B: dict[str, Any] = dict(
    vocab_size=262208, hidden_size=3840, intermediate_size=15360, num_hidden_layers=48, num_attention_heads=16,
    num_key_value_heads=8, head_dim=256, query_pre_attn_scalar=256, hidden_activation="gelu_pytorch_tanh",
    max_position_embeddings=131072, rms_norm_eps=1e-6, sliding_window=1024,
    layer_types=[("full_attention" if (i + 1) % 6 == 0 else "sliding_attention") for i in range(48)],
    rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                     "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0}},
)

CONFIGS: dict[str, dict[str, Any]] = {
    "tiny": dict(gemma=dict(TINY_CONFIGS["gemma"]), features="v1", audio=True),
    "tiny-v2": dict(gemma=dict(TINY_CONFIGS["gemma"]), features="v2", video_dim=64, audio_dim=32, audio=True),
    "published": dict(gemma=GEMMA3_12B, features="v1", audio=True),
    "published-v2": dict(gemma=GEMMA3_12B, features="v2", video_dim=V2_DEFAULT_DIMS[0],
                         audio_dim=V2_DEFAULT_DIMS[1], audio=True),
}
_DICT_KEYS = ("base", "gemma", "features", "video_dim", "audio_dim", "audio")


# ----------------------------------------------------------------------------- normalisation


def norm_v1(encoded: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """LTX-2 V1 normalisation (ltx_core ``_norm_and_concat_padded_batch``), the same operations in
    the same order and dtypes: ``encoded [B, T, D, L]``, ``mask [B, T]`` 0/1 -> ``[B, T, D*L]``.

    Per prompt and layer, over the valid tokens and all hidden dims: ``mean`` (float32: the count
    ``n * D + eps`` promotes it), ``range = max - min``; ``8 * (x - mean) / (range + eps)``;
    padded rows 0."""
    b, _, d, n_layers = encoded.shape
    valid = mask.bool()[:, :, None, None]
    masked = encoded.masked_fill(~valid, 0.0)
    denom = (mask.sum(dim=-1) * d).view(b, 1, 1, 1)
    mean = masked.sum(dim=(1, 2), keepdim=True) / (denom + EPS)
    x_min = encoded.masked_fill(~valid, float("inf")).amin(dim=(1, 2), keepdim=True)
    x_max = encoded.masked_fill(~valid, float("-inf")).amax(dim=(1, 2), keepdim=True)
    normed = V1_SCALE * (encoded - mean) / (x_max - x_min + EPS)
    normed = normed.reshape(b, -1, d * n_layers)
    return normed.masked_fill(~valid[..., 0].expand(-1, -1, d * n_layers), 0.0)


def norm_v2(encoded: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """LTX-2 V2 normalisation (ltx_core ``norm_and_concat_per_token_rms``): each token and layer
    divided by its RMS over the hidden dims (``rsqrt(mean(x^2) + eps)``), in the input dtype;
    ``[B, T, D, L]`` -> ``[B, T, D*L]``, padded rows 0."""
    b, t, d, n_layers = encoded.shape
    variance = torch.mean(encoded ** 2, dim=2, keepdim=True)
    normed = (encoded * torch.rsqrt(variance + EPS)).reshape(b, t, d * n_layers)
    return torch.where(mask.bool().unsqueeze(-1), normed, torch.zeros_like(normed))


class LTX2FeatureExtractor(nn.Module):
    """LTX-2's feature extractor (Blocks 1-2): normalisation + projection of the stacked hidden states.

    Parameters are named as in diffusers' ``LTX2TextConnectors``: V1 ``text_proj_in`` (ltx_core
    ``aggregate_embed``), V2 ``video_text_proj_in`` / ``audio_text_proj_in`` (``video_aggregate_embed``
    / ``audio_aggregate_embed``). ``forward(encoded [B,T,D,L], mask [B,T]) -> (video, audio | None)``.
    """

    def __init__(self, version: str, hidden_size: int, num_layers: int, *, video_dim: int | None = None,
                 audio_dim: int | None = None, audio: bool = True, bias: bool | None = None) -> None:
        super().__init__()
        if version not in ("v1", "v2"):
            raise ValueError(f"LTX-2 feature extractor version must be 'v1' or 'v2', got {version!r}")
        self.version = version
        self.hidden_size = int(hidden_size)
        self.num_layers = int(num_layers)
        flat = self.hidden_size * self.num_layers
        if version == "v1":
            # V1 always projects to the hidden size (no bias) and gives video and audio the same tensor
            self.text_proj_in = nn.Linear(flat, self.hidden_size, bias=bool(bias))
            self.audio = bool(audio)
        else:
            v, a = video_dim or V2_DEFAULT_DIMS[0], audio_dim or V2_DEFAULT_DIMS[1]
            self.video_text_proj_in = nn.Linear(flat, int(v), bias=True if bias is None else bool(bias))
            self.audio_text_proj_in = (nn.Linear(flat, int(a), bias=True if bias is None else bool(bias))
                                       if audio else None)
            self.audio = self.audio_text_proj_in is not None

    @property
    def video_dim(self) -> int:
        return (self.text_proj_in if self.version == "v1" else self.video_text_proj_in).out_features

    @property
    def audio_dim(self) -> int | None:
        if not self.audio:
            return None
        return self.video_dim if self.version == "v1" else self.audio_text_proj_in.out_features

    def forward(self, encoded: torch.Tensor | tuple[torch.Tensor, ...], mask: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        if isinstance(encoded, (list, tuple)):
            encoded = torch.stack(encoded, dim=-1)
        if encoded.shape[-2:] != (self.hidden_size, self.num_layers):
            raise ValueError(f"hidden states {tuple(encoded.shape)} do not match the feature extractor's "
                             f"[.., {self.hidden_size}, {self.num_layers}]")
        dtype = encoded.dtype
        if self.version == "v1":
            video = self.text_proj_in(norm_v1(encoded, mask).to(dtype))
            return video, (video if self.audio else None)
        normed = norm_v2(encoded, mask).to(dtype)
        video = self.video_text_proj_in(normed * math.sqrt(self.video_text_proj_in.out_features / self.hidden_size))
        audio = None
        if self.audio_text_proj_in is not None:
            audio = self.audio_text_proj_in(normed * math.sqrt(self.audio_text_proj_in.out_features / self.hidden_size))
        return video, audio

    @classmethod
    def from_connectors(cls, connectors) -> "LTX2FeatureExtractor":
        """The projection of a diffusers ``LTX2TextConnectors`` (its modules, not copies)."""
        c = connectors.config
        hidden, n_layers = int(c.caption_channels), int(c.text_proj_in_factor)
        with torch.device("meta"):  # shell only: the real modules are attached below
            if c.per_modality_projections:
                fe = cls("v2", hidden, n_layers, video_dim=int(c.video_hidden_dim), audio_dim=int(c.audio_hidden_dim),
                         bias=bool(c.proj_bias))
            else:
                fe = cls("v1", hidden, n_layers, bias=bool(c.proj_bias))
        if fe.version == "v1":
            fe.text_proj_in = connectors.text_proj_in
        else:
            fe.video_text_proj_in = connectors.video_text_proj_in
            fe.audio_text_proj_in = connectors.audio_text_proj_in
        return fe


# ----------------------------------------------------------------------------- configs


def resolve_config(config: str | dict) -> tuple[dict[str, Any], str]:
    """``(config, name)``: the Gemma3TextConfig keywords under ``"gemma"`` plus ``features``,
    ``video_dim``, ``audio_dim``, ``audio``; ``name`` is the config's name or ``"custom"``."""
    if isinstance(config, str):
        if config not in CONFIGS:
            raise ValueError(f"unknown ltx2 text config {config!r}; use {', '.join(map(repr, CONFIGS))} or a dict")
        return copy.deepcopy(CONFIGS[config]), config
    if not isinstance(config, dict):
        raise ValueError(f"ltx2 text config must be a name or a dict, got {type(config).__name__}")
    unknown = sorted(set(config) - set(_DICT_KEYS))
    if unknown:
        raise ValueError(f"unknown ltx2 text config keys {unknown}; known: {list(_DICT_KEYS)}")
    base = config.get("base", "tiny")
    out, _ = resolve_config(base if isinstance(base, str) else "")
    if "gemma" in config:
        out["gemma"] = {**out["gemma"], **dict(config["gemma"])}
    for key in ("features", "video_dim", "audio_dim", "audio"):
        if key in config:
            out[key] = config[key]
    if out["features"] not in ("v1", "v2"):
        raise ValueError(f"ltx2 features must be 'v1' or 'v2', got {out['features']!r}")
    if out["features"] == "v1":
        if config.get("video_dim") is not None or config.get("audio_dim") is not None:
            raise ValueError("ltx2 V1 projects to the Gemma hidden size for video and audio: video_dim / audio_dim "
                             "are V2 settings")
        out.pop("video_dim", None)
        out.pop("audio_dim", None)
    else:
        out.setdefault("video_dim", V2_DEFAULT_DIMS[0])
        out.setdefault("audio_dim", V2_DEFAULT_DIMS[1])
    return out, "custom"


def feature_dims(config: str | dict = "tiny") -> tuple[int, int | None]:
    """``(D_v, D_a or None)`` of a random-weight ``config``, without building anything."""
    cfg, _ = resolve_config(config)
    if cfg["features"] == "v1":
        from transformers import Gemma3TextConfig

        hidden = int(cfg["gemma"].get("hidden_size", Gemma3TextConfig().hidden_size))
        return hidden, (hidden if cfg["audio"] else None)
    return int(cfg["video_dim"]), (int(cfg["audio_dim"]) if cfg["audio"] else None)


def pretrained_feature_dims(pretrained: str, revision: str | None = None,
                            cache_dir: str | None = None) -> tuple[int, int | None] | None:
    """``(D_v, D_a)`` from a diffusers LTX-2 folder's ``connectors/config.json`` (None if not on disk).
    Diffusers' connectors always make audio features; a config there that is not a JSON object is a
    :class:`~shardsmith.encode.vae_config.ConfigFileError` naming it."""
    from .vae_config import read_config_file

    folder, _, _ = resolve_model_folder(str(pretrained), "connectors", revision, cache_dir)
    if folder is None or not (folder / "config.json").is_file():
        return None
    c = read_config_file(folder / "config.json", "models.text")
    if c.get("per_modality_projections"):
        return int(c.get("video_hidden_dim", V2_DEFAULT_DIMS[0])), int(c.get("audio_hidden_dim", V2_DEFAULT_DIMS[1]))
    d = int(c.get("caption_channels", 3840))
    return d, d


def window(n: int, max_length: int) -> int:
    """How many of the last columns of the left-padded ``max_length`` layout Gemma runs over for a
    prompt of ``n`` tokens: the smallest of ``WINDOWS`` (then ``max_length``) that holds it. A
    function of the prompt alone, so a prompt's shapes do not depend on its batch-mates."""
    return next((w for w in WINDOWS if n <= w < max_length), max_length)


def forwards(groups: dict[int, list[int]]) -> list[tuple[int, list[int]]]:
    """``(window, prompt indices)`` of each Gemma forward: each window's prompts in order, at most
    ``MAX_FORWARD_TOKENS // window`` (at least 1) a forward."""
    out = []
    for w, rows in sorted(groups.items()):
        step = max(1, MAX_FORWARD_TOKENS // w)
        out += [(w, rows[k:k + step]) for k in range(0, len(rows), step)]
    return out


# ----------------------------------------------------------------------------- tokenizer


def standin_tokenizer():
    """The MiniLM WordPiece tokenizer, made to behave as Gemma 3's does on LTX's encode path: no
    special tokens of its own (no [SEP] / EOS), ``[CLS]`` as BOS (forced by :meth:`LTX2TextEncoder.tokenize`
    as LTX's ``LTXGemmaTokenizer`` forces ``<bos>``), ``[PAD]`` (id 0, as Gemma's) as pad. A plain
    ``tokenizers``-backed tokenizer, so ``save_pretrained`` / ``AutoTokenizer`` keep this behaviour."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    base = _standin_tokenizer()
    backend = Tokenizer.from_str(base.backend_tokenizer.to_str())
    backend.post_processor = None
    backend.no_padding()
    backend.no_truncation()
    return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token=base.cls_token, eos_token=base.sep_token,
                                   pad_token=base.pad_token, unk_token=base.unk_token)


# ----------------------------------------------------------------------------- encoder


class LTX2TextEncoder(TextEncoder):
    """Gemma 3 + LTX-2's feature extractor behind :class:`~shardsmith.encode.text.TextEncoder`'s interface."""

    def __init__(self, spec: EncoderSpec, provenance: Provenance, model, tokenizer,
                 features: LTX2FeatureExtractor) -> None:
        super().__init__(spec, provenance, model, tokenizer)
        self.features = features
        if tokenizer.bos_token_id is None:
            raise ValueError("the ltx2 text encoder's tokenizer has no BOS token; LTX-2's encode path needs a "
                             "leading BOS")

    def tokenize(self, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor, list[bool]]:
        """LTX's ``LTXGemmaTokenizer.tokenize_with_weights``, for a batch: each prompt stripped,
        tokenized (the tokenizer's own special tokens) and truncated to ``max_length``; a leading BOS
        prepended when missing (then cut to ``max_length`` again); left padded with the pad id.
        ``truncated[i]``: prompt i lost tokens."""
        if isinstance(prompts, str):
            raise TypeError("encode() takes a list of prompts, not a single string")
        texts = [str(p).strip() for p in prompts]
        if not texts:
            raise ValueError("encode() needs at least one prompt")
        L = self.spec.max_length
        tok = self.tokenizer
        bos = tok.bos_token_id
        enc = tok(texts, padding=False, truncation=True, max_length=L)
        encodings = getattr(enc, "encodings", None) if getattr(tok, "is_fast", False) else None
        if encodings is not None and len(encodings) == len(texts):
            cut = [len(e.overflowing) > 0 for e in encodings]
        else:  # slow tokenizer: count the untruncated length
            cut = [len(ids) > L for ids in tok(texts, padding=False, truncation=False)["input_ids"]]
        ids = torch.full((len(texts), L), int(tok.pad_token_id), dtype=torch.int64)
        mask = torch.zeros((len(texts), L), dtype=torch.int64)
        truncated = []
        for i, seq in enumerate(enc["input_ids"]):
            seq = list(seq)
            if not seq or seq[0] != bos:
                cut[i] = cut[i] or len(seq) >= L  # the forced BOS pushes the last token out
                seq = [bos, *seq][:L]
            ids[i, L - len(seq):] = torch.tensor(seq, dtype=torch.int64)
            mask[i, L - len(seq):] = 1
            truncated.append(bool(cut[i]))
        return ids, mask, truncated

    def encode(self, prompts: list[str], *, device: str | torch.device | None = None,
               non_blocking: bool = False) -> TextEmbeddings:
        """``video_prompt_embeds`` (``emb``), ``audio_prompt_embeds`` (``audio_emb``; V1: the same tensor
        as ``emb``) and ``prompt_attention_mask`` (``mask``) of ``prompts``, in the spec's dtype. Gemma
        runs once per window group (module doc); the feature extractor once per prompt.
        ``device`` / ``non_blocking`` as :meth:`TextEncoder.encode`."""
        ids, mask, truncated = self.tokenize(prompts)
        B, L = ids.shape
        counts = mask.sum(-1).tolist()
        dev = self.device
        fe = self.features
        groups: dict[int, list[int]] = {}
        for i, n in enumerate(counts):
            groups.setdefault(window(n, L), []).append(i)
        with torch.inference_mode():
            dt = next(fe.parameters()).dtype
            video = torch.empty((B, L, fe.video_dim), dtype=dt, device=dev)
            audio = None
            if fe.audio:
                audio = video if fe.version == "v1" else torch.empty((B, L, fe.audio_dim), dtype=dt, device=dev)
            mask_d = to_device(mask, dev)
            for W, rows in forwards(groups):
                # at least max_length tokens a forward (LTX's own size), filled with repeats of the chunk's
                # prompts (outputs unused): the matrix products then have LTX's shapes or larger
                sel = torch.tensor([rows[k % len(rows)] for k in range(max(len(rows), -(-L // W)))])
                pos = torch.arange(L - W, L, device=dev).unsqueeze(0).expand(len(sel), -1)
                out = self.model(input_ids=to_device(ids[sel, L - W:], dev), attention_mask=mask_d[sel, L - W:],
                                 position_ids=pos, output_hidden_states=True, use_cache=False)
                hidden = out.hidden_states
                if len(hidden) != fe.num_layers:
                    raise ValueError(f"the text model returned {len(hidden)} hidden states; the feature extractor "
                                     f"takes {fe.num_layers} (num_hidden_layers + 1)")
                for j, i in enumerate(rows):
                    # LTX's input exactly: [1, max_length, D, layers], this prompt's states in its last n rows
                    # (padded rows are masked out before any use; zeros here)
                    n = counts[i]
                    x = hidden[0].new_zeros((1, L, fe.hidden_size, fe.num_layers))
                    x[:, L - n:] = torch.stack([h[j:j + 1, W - n:] for h in hidden], dim=-1)
                    v, a = fe(x, mask_d[i:i + 1])
                    video[i] = v[0]
                    if audio is not None and audio is not video:
                        audio[i] = a[0]
                    del x, v, a
                del out, hidden
            sdt = _torch_dtype(self.spec.dtype)
            if video.dtype != sdt:
                shared = audio is video
                video = video.to(sdt)
                audio = video if shared else (None if audio is None else audio.to(sdt))
        if device is not None:
            out_dev = torch.device(device)
            mask_out = mask.to(out_dev)
            shared = audio is video
            pinned = non_blocking and out_dev.type == "cpu" and video.device.type == "cuda"
            move = to_pinned if pinned else (lambda t: t.to(out_dev))
            video = move(video)
            audio = video if shared else (None if audio is None else move(audio))
        else:
            mask_out = mask.to(dev)
        return TextEmbeddings(emb=video, mask=mask_out, pooled=None, truncated=truncated, audio_emb=audio)

    __call__ = encode


def _gemma_config(cfg: dict[str, Any], tokenizer):
    import transformers as tf

    g = dict(cfg["gemma"])
    g.setdefault("vocab_size", len(tokenizer))
    conf = tf.Gemma3TextConfig(**g, pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
                               eos_token_id=tokenizer.eos_token_id)
    if conf.vocab_size < len(tokenizer):
        raise ValueError(f"config vocab_size {conf.vocab_size} < stand-in tokenizer vocab {len(tokenizer)}")
    return conf


def _hash_folders(folders: list[Path]) -> tuple[str | None, list[str]]:
    """sha256 over the weight files of ``folders`` in that order (each folder's files by name)."""
    h = hashlib.sha256()
    names: list[str] = []
    for folder in folders:
        for f in sorted(find_weight_files(folder), key=lambda p: p.name):
            names.append(f"{folder.name}/{f.name}")
            with open(f, "rb") as fh:
                while chunk := fh.read(1 << 20):
                    h.update(chunk)
    return (h.hexdigest() if names else None), names


def load_ltx2_text_encoder(
    *,
    pretrained: str | None = None,
    revision: str | None = None,
    config: str | dict = "tiny",
    max_length: int | None = None,
    dtype: str = "float32",
    device: str | torch.device = "cpu",
    cache_dir: str | None = None,
) -> LTX2TextEncoder:
    """Load LTX-2's text conditioning (Gemma 3 + feature extractor); see the module doc.

    ``pretrained``: a diffusers-format LTX-2 folder or hub repo id (offline: on disk / in the HF
    cache) with ``text_encoder/``, ``tokenizer/`` and ``connectors/``. Otherwise ``config`` builds
    seeded random weights (provenance ``"random-weights"``)."""
    from transformers import AutoModel, AutoTokenizer

    tdt = _torch_dtype(dtype)
    notes: list[str] = []
    if pretrained is not None:
        from diffusers.pipelines.ltx2 import LTX2TextConnectors

        kw: dict[str, Any] = {}
        if revision:
            kw["revision"] = revision
        if cache_dir:
            kw["cache_dir"] = str(cache_dir)
        model = AutoModel.from_pretrained(str(pretrained), subfolder="text_encoder", dtype=tdt, **kw)
        tok = AutoTokenizer.from_pretrained(str(pretrained), subfolder="tokenizer", **kw)
        connectors = LTX2TextConnectors.from_pretrained(str(pretrained), subfolder="connectors", torch_dtype=tdt, **kw)
        features = LTX2FeatureExtractor.from_connectors(connectors)
        conn_cfg = dict(connectors.config)
        del connectors  # the connectors (Block 3) run at train time: only the projection is kept
        text_cfg = getattr(model.config, "text_config", None) or model.config
        if (text_cfg.hidden_size, text_cfg.num_hidden_layers + 1) != (features.hidden_size, features.num_layers):
            raise ValueError(f"{pretrained}: connectors expect {features.num_layers} hidden states of "
                             f"{features.hidden_size}; the text encoder has {text_cfg.num_hidden_layers + 1} of "
                             f"{text_cfg.hidden_size}")
        folders, resolved = [], revision
        for sub in ("text_encoder", "connectors"):
            folder, resolved, note = resolve_model_folder(str(pretrained), sub, revision, cache_dir)
            if note:
                notes.append(note)
            if folder is not None:
                folders.append(folder)
        sha, files = _hash_folders(folders)
        if sha is not None:
            notes.append("weights_sha256: sha256 over text_encoder's then connectors' weight files")
        prov = Provenance(
            cls=f"{type(model).__name__} + LTX2TextConnectors projection", weights="pretrained",
            path_or_repo=str(pretrained), revision=resolved, weights_sha256=sha,
            config={"text_encoder": model.config.to_dict(), "connectors": conn_cfg}, weight_files=files,
            tokenizer=f"{pretrained}/tokenizer", notes=notes,
        )
        cfg_features = features.version
    else:
        import transformers as tf

        cfg, cfg_name = resolve_config(config)
        tok = standin_tokenizer()
        conf = _gemma_config(cfg, tok)
        # fp32 as the classes initialise, straight on the target device; cast after (as text.py)
        with seeded_init(device):
            model = tf.Gemma3TextModel(conf)
        with seeded_init(device):
            features = LTX2FeatureExtractor(cfg["features"], conf.hidden_size, conf.num_hidden_layers + 1,
                                            video_dim=cfg.get("video_dim"), audio_dim=cfg.get("audio_dim"),
                                            audio=cfg["audio"])
        notes.append("random weights (torch.manual_seed(0)): embeddings are NOT model-space data")
        notes.append("stand-in tokenizer: no special tokens of its own; BOS ([CLS]) forced as LTX forces <bos>")
        if (note := device_init_note(device)) is not None:
            notes.append(note)
        prov = Provenance(
            cls="Gemma3TextModel + LTX2FeatureExtractor", weights="random-weights",
            config={"text_encoder": conf.to_dict(), "features": {k: v for k, v in cfg.items() if k != "gemma"}},
            config_name=cfg_name, seed=SEED, tokenizer=STANDIN_TOKENIZER, notes=notes,
        )
        cfg_features = cfg["features"]

    if tok.pad_token_id is None:  # as LTXGemmaTokenizer
        tok.pad_token = tok.eos_token
        prov.notes.append("tokenizer had no pad token; using eos as pad")
    model = model.to(device=device, dtype=tdt).eval().requires_grad_(False)
    features = features.to(device=device, dtype=tdt).eval().requires_grad_(False)
    L = int(max_length or MAX_LENGTH)
    text_cfg = getattr(model.config, "text_config", None) or model.config
    maxpos = getattr(text_cfg, "max_position_embeddings", None)
    from shardsmith.precheck import check_max_length

    check_max_length(L, maxpos if isinstance(maxpos, int) else None, f"ltx2's {type(model).__name__}")
    spec = EncoderSpec(
        kind="text", family="ltx2", dtype=_dtype_name(tdt), max_length=L, dim=features.video_dim,
        padding_side="left", pooled_dim=None, zero_padding=cfg_features == "v1", hidden_states="all",
        audio_dim=features.audio_dim, features=f"ltx2-{cfg_features}",
    )
    return LTX2TextEncoder(spec, prov, model, tok, features)
