"""GPU memory of the recipe's text encoder and VAE before either is loaded: what ``models.offload: auto``
settles on (:mod:`~shardsmith.encode.offload`).

Contract
- :func:`estimate(recipe, name, batch)`: a :class:`~shardsmith.encode.memory_plan.ModelMemory` for ``"text"``
  or ``"vae"`` at ``batch`` items, with ``peak_bytes`` an estimate (``what`` says so), or None when the
  model's config cannot be had without loading it (say ``ltx2`` text from a pipeline folder).
- Weights: the model built from its config on torch's ``meta`` device (no memory is taken and no weight
  file is read), counted at ``models.*.dtype``; with ``models.text.quantize`` the linear layers' weights at
  one byte each (torchao's int8 / float8, as :func:`~shardsmith.encode.quantize.quantize_text` stores them).
- Activations per item, tabulated (the warm-up measures the real peak; the build prints both):
  text: ``max_length x (width + MLP width) x dtype bytes x`` :data:`TEXT_LIVE`, calibrated on the H200
  (BENCHMARKS.md section 11: Gemma 3 published, 1,024 tokens, bf16, 75 MiB a prompt measured), plus every
  layer's hidden states in float32 for the encoders that average or stack them (``gemma`` mean_all,
  ``ltx2``); VAE: the first block's activation (``frames x height x width x`` its channels, over the patch
  size; Wan's VAE holds :data:`WAN_CHUNK` frames at once) ``x dtype bytes x`` :data:`VAE_LIVE` (on the H200
  for SD's VAE at 256x256, bf16: 100.7 MB an item estimated, 101.1 MB measured; no video VAE measured: a
  coarse figure there).
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from shardsmith.encode.memory_plan import ModelMemory, param_bytes
from shardsmith.precheck import local_path

log = logging.getLogger(__name__)

TEXT_LIVE = 3.4  # live [L, width + MLP width] tensors of one prompt at the peak (BENCHMARKS §11: 78.9 MB / 23.6 MB)
VAE_LIVE = 6  # live full-resolution tensors of the first block (input, conv out, norm, residual, ...)
WAN_CHUNK = 5  # frames AutoencoderKLWan's encoder holds at once
_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def _meta(build) -> Any:
    """``build()`` under the meta device: shapes and dtypes only."""
    with torch.device("meta"):
        return build()


def _quantized_bytes(model, total: int) -> int:
    """``total`` with every linear layer's weight at one byte an element (weight-only int8 / float8)."""
    saved = 0
    for mod in model.modules():
        if isinstance(mod, torch.nn.Linear):
            saved += mod.weight.numel() * (mod.weight.element_size() - 1)
    return total - saved


def _text_model(t):
    """The text encoder's module on the meta device (random configs through the loader itself)."""
    from shardsmith.encode.text import _model_class, load_text_encoder

    if t.pretrained is None:
        return load_text_encoder(t.family, config=t.config, max_length=t.max_length, dtype=t.dtype,
                                 device="meta").model
    from transformers import AutoConfig

    sub = "text_encoder" if t.family == "ltx2" else None
    cfg = AutoConfig.from_pretrained(local_path(str(t.pretrained)), **({"subfolder": sub} if sub else {}))
    cls = _model_class("gemma" if t.family == "ltx2" else t.family, True)
    return _meta(lambda: cls.from_config(cfg)).to(_dtype(t.dtype))


def _vae_model(v):
    from shardsmith.encode.vae import _diffusers_class
    from shardsmith.encode.vae_config import resolve_config

    cls = _diffusers_class(v.family)
    if v.pretrained is None:
        cfg, _ = resolve_config(v.family, v.config)
        return _meta(lambda: cls(**cfg)).to(_dtype(v.dtype))
    kw = {k: val for k, val in (("subfolder", v.subfolder), ("revision", v.revision)) if val}
    cfg = cls.load_config(local_path(str(v.pretrained)), **kw)
    return _meta(lambda: cls.from_config(cfg)).to(_dtype(v.dtype))


def _dtype(name: str) -> torch.dtype:
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def _cfg(model, *names: str, default: int = 0) -> int:
    c = getattr(model.config, "text_config", None) or model.config
    get = c.get if isinstance(c, dict) else (lambda k, d=None: getattr(c, k, d))
    for n in names:
        v = get(n, None)
        if isinstance(v, int):
            return v
        if isinstance(v, (list, tuple)) and v and isinstance(v[0], int):
            return v[0]
    return default


def text_per_item(model, t, max_length: int) -> int:
    """Activation bytes of one prompt (see the module)."""
    width = _cfg(model, "hidden_size", "d_model")
    mlp = _cfg(model, "intermediate_size", "d_ff", default=4 * width)
    per = int(max_length * (width + mlp) * _BYTES[t.dtype] * TEXT_LIVE)
    stacked = t.family == "ltx2" or (t.family == "gemma" and getattr(t, "hidden_states", "last") == "mean_all")
    if stacked:
        per += max_length * width * (_cfg(model, "num_hidden_layers", "num_layers") + 1) * 4
    return per


def vae_per_item(model, v, frames: int, height: int, width: int) -> int:
    """Activation bytes of one item at a ``frames x height x width`` bucket (see the module)."""
    cfg = dict(model.config)
    first = cfg.get("block_out_channels") or [cfg.get("base_dim") or 128]
    channels = first[0] if isinstance(first, (list, tuple)) else int(first)
    patch = cfg.get("patch_size") or 1
    patch_t = cfg.get("patch_size_t") or 1
    if v.family == "wan":  # AutoencoderKLWan encodes causally, 1 + 4 frames at a time (its feature cache)
        frames = min(frames, WAN_CHUNK)
    return int(frames * height * width * channels / (patch * patch * patch_t) * _BYTES[v.dtype] * VAE_LIVE)


def _named(m) -> str:
    """The weights or config a person would name (a config given as a dict: "custom config")."""
    return m.pretrained or (m.config if isinstance(m.config, str) else "custom config")


def estimate(recipe, name: str, batch: int) -> ModelMemory | None:
    """``name`` (``text`` or ``vae``) of ``recipe.models`` at ``batch`` items, estimated (see the module)."""
    from shardsmith.encode.stage import import_libraries

    m = recipe.models
    try:
        import_libraries(recipe)  # as the load will (lean where it may): the first import of the process is this one
        if name == "text":
            t = m.text
            model = _text_model(t)
            from shardsmith.encode.text import FAMILIES

            length = int(t.max_length or FAMILIES[t.family]["max_length"])
            weights = param_bytes(model)
            if t.quantize != "none":
                weights = _quantized_bytes(model, weights)
            per, what = text_per_item(model, t, length), f"{t.family} ({_named(t)}) {length} tokens"
        else:
            from shardsmith.transform.buckets import parse_buckets

            v = m.vae
            model = _vae_model(v)
            weights = param_bytes(model)
            buckets = parse_buckets(recipe.encode_buckets() or []) or []
            per = max((vae_per_item(model, v, b.frames, b.height, b.width) for b in buckets), default=0)
            big = max(buckets, key=lambda b: b.frames * b.height * b.width, default=None)
            what = f"{v.family} ({_named(v)})" + (f" @ {big}" if big is not None else "")
    except Exception as exc:  # noqa: BLE001 - no estimate: the caller says so and runs as before
        log.info("no memory estimate for models.%s: %s: %s", name, type(exc).__name__, exc)
        return None
    return ModelMemory(name, what + " (estimated before loading)", batch, weights, weights + batch * per)
