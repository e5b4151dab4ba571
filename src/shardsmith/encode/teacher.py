"""The teacher of ``shardsmith distill``: one more encoder, run for several solver steps.

Contract
- ``load_teacher(family, ...)`` returns a :class:`Teacher`: ``spec`` (``TeacherSpec``: family,
  parameterisation, dtype, latent channels, the text-embedding width it takes) and ``provenance``
  (:class:`~shardsmith.encode.spec.Provenance`; ``random-weights`` for a model built from a config).
- ``Teacher.predict(x, t, cond, mask)``: the model's raw output on a batch: the velocity (``flow``) or
  the denoised sample (``edm``), float32, shaped like ``x``. ``x``: ``[B, C, (T,) H, W]`` float32;
  ``t``: one time for the batch (flow ``t``, edm ``sigma``); ``cond``: ``[B, L, D]``; ``mask``: ``[B, L]``.
- Families: ``callable`` (``entry_point`` ``package.module:function``, called as ``f(x, t [B], cond)``;
  its provenance names the function and the sha256 of its module's source) and ``sana`` (diffusers
  ``SanaTransformer2DModel``, flow matching, the model takes ``t * 1000`` as the Sana pipeline does;
  ``from_pretrained`` with ``pretrained``, else the ``tiny`` / ``published`` config or a dict with
  random weights).
- ``teacher_settings(...)``: the latent channels and text width from the config alone (no model
  built), for the precheck; ``None`` for a pretrained config that is not on disk.
- An entry point that cannot be imported or is not callable is a :class:`TeacherError` naming it.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch

from shardsmith.errors import UserError

from .spec import Provenance, hash_pretrained, pretrained_kwargs
from .vae import SEED, _torch_dtype, device_init_note, seeded_init


class TeacherError(UserError):
    """A teacher that cannot be used as the recipe names it."""


#: Sana's configs: ``tiny`` for tests (takes MiniLM's 384-wide embeddings), ``published``: the
#: Sana_600M_512px_diffusers transformer (hidden 1152 = 36 heads x 32, 28 layers, cross-attention
#: 16 x 72, Gemma-2 2304-wide captions, 32 DC-AE latent channels, 16x16 latents for 512 px).
SANA_CONFIGS: dict[str, dict[str, Any]] = {
    "tiny": dict(in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=8, num_layers=2,
                 num_cross_attention_heads=2, cross_attention_head_dim=8, cross_attention_dim=16,
                 caption_channels=384, mlp_ratio=2.5, sample_size=8, patch_size=1),
    "published": dict(in_channels=32, out_channels=32, num_attention_heads=36, attention_head_dim=32, num_layers=28,
                      num_cross_attention_heads=16, cross_attention_head_dim=72, cross_attention_dim=1152,
                      caption_channels=2304, mlp_ratio=2.5, sample_size=16, patch_size=1,
                      norm_elementwise_affine=False, norm_eps=1e-6),
}


@dataclass
class TeacherSpec:
    """What a teacher takes and gives."""

    family: str
    parameterisation: str  # "flow" | "edm"
    dtype: str = "float32"
    latent_channels: int | None = None  # None: any (a callable)
    text_dim: int | None = None  # the embedding width it takes; None: any
    kind: str = "teacher"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Teacher:
    """A loaded teacher (see the module contract)."""

    def __init__(self, spec: TeacherSpec, provenance: Provenance, fn: Callable, device: str):
        self.spec, self.provenance, self._fn, self.device = spec, provenance, fn, device

    def predict(self, x: torch.Tensor, t: float, cond: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        out = self._fn(x, t, cond, mask)
        if out.shape != x.shape:
            raise TeacherError(f"teacher {self.provenance.path_or_repo or self.spec.family} returned shape "
                               f"{tuple(out.shape)} for a state of shape {tuple(x.shape)}; it must return the "
                               "velocity (flow) or the denoised sample (edm), shaped like its input")
        return out.float()


def resolve_entry_point(entry_point: str) -> Callable:
    """``package.module:function`` -> the function; a :class:`TeacherError` naming what is wrong."""
    mod_name, _, attr = entry_point.partition(":")
    try:
        module = importlib.import_module(mod_name)
    except Exception as exc:  # noqa: BLE001 - any import failure is the user's module's
        raise TeacherError(f"models.teacher.entry_point {entry_point!r}: module {mod_name!r} cannot be imported "
                           f"({type(exc).__name__}: {exc}); put it on PYTHONPATH or fix the name") from None
    fn = module
    for part in attr.split("."):
        fn = getattr(fn, part, None)
        if fn is None:
            raise TeacherError(f"models.teacher.entry_point {entry_point!r}: {mod_name} has no {attr!r}")
    if not callable(fn):
        raise TeacherError(f"models.teacher.entry_point {entry_point!r} is not callable")
    return fn


def _source_sha256(fn: Callable) -> str | None:
    try:
        return hashlib.sha256(inspect.getsource(inspect.getmodule(fn)).encode()).hexdigest()
    except (OSError, TypeError):
        return None


def sana_config(config: str | dict[str, Any]) -> dict[str, Any]:
    if isinstance(config, dict):
        return dict(config)
    if config not in SANA_CONFIGS:
        raise TeacherError(f"models.teacher.config {config!r}: sana has the configs {sorted(SANA_CONFIGS)} (or give "
                           "a dict of SanaTransformer2DModel's config)")
    return dict(SANA_CONFIGS[config])


def teacher_settings(family: str, *, config: str | dict[str, Any] = "tiny", pretrained: str | None = None,
                     subfolder: str | None = None) -> dict[str, Any] | None:
    """``{"latent_channels", "text_dim"}`` from the config (None where the callable decides or a
    pretrained config is not on disk)."""
    if family == "callable":
        return {"latent_channels": None, "text_dim": None}
    if pretrained is not None:
        from pathlib import Path
        import json

        cfg_file = Path(pretrained, subfolder or "", "config.json")
        if not cfg_file.is_file():
            return None
        cfg = json.loads(cfg_file.read_text(encoding="utf-8"))
    else:
        cfg = sana_config(config)
    return {"latent_channels": cfg.get("in_channels", 32), "text_dim": cfg.get("caption_channels", 2304)}


def load_teacher(family: str, *, entry_point: str | None = None, parameterisation: str | None = None,
                 pretrained: str | None = None, subfolder: str | None = None, revision: str | None = None,
                 config: str | dict[str, Any] = "tiny", dtype: str = "float32", device: str = "cpu") -> Teacher:
    if family == "callable":
        fn = resolve_entry_point(entry_point or "")
        prov = Provenance(cls=f"{fn.__module__}.{fn.__qualname__}", weights="pretrained", path_or_repo=entry_point,
                          weights_sha256=_source_sha256(fn),
                          notes=["a Python callable: weights_sha256 is the sha256 of its module's source"])
        spec = TeacherSpec("callable", parameterisation or "flow", dtype)
        dt = _torch_dtype(dtype)

        def call(x, t, cond, mask):
            tt = torch.full((x.shape[0],), float(t), dtype=dt, device=x.device)
            return fn(x.to(dt), tt, cond.to(dt))
        return Teacher(spec, prov, call, device)
    if family != "sana":
        raise TeacherError(f"models.teacher.family {family!r}: use callable or sana")
    from diffusers import SanaTransformer2DModel

    dt = _torch_dtype(dtype)
    if pretrained is not None:
        model = SanaTransformer2DModel.from_pretrained(pretrained, **pretrained_kwargs("torch_dtype", dt, subfolder,
                                                                                         revision, None))
        sha, files, resolved, notes = hash_pretrained(pretrained, subfolder, revision)
        prov = Provenance(cls="SanaTransformer2DModel", weights="pretrained", path_or_repo=pretrained,
                          subfolder=subfolder, revision=resolved, config=dict(model.config), weights_sha256=sha,
                          weight_files=files, notes=notes)
        model = model.to(device)
    else:
        cfg = sana_config(config)
        with seeded_init(device):
            model = SanaTransformer2DModel(**cfg)
        model = model.to(dtype=dt)
        note = device_init_note(device)
        prov = Provenance(cls="SanaTransformer2DModel", weights="random-weights", config=dict(model.config),
                          config_name=config if isinstance(config, str) else "custom", seed=SEED,
                          notes=[note] if note else [])
    model.eval().requires_grad_(False)
    cfg = model.config
    spec = TeacherSpec("sana", "flow", dtype, latent_channels=cfg.in_channels, text_dim=cfg.caption_channels)
    scale = 1000.0

    @torch.inference_mode()
    def call(x, t, cond, mask):
        if x.dim() != 4:
            raise TeacherError(f"sana is an image model: its samples are [C, H, W], got a state of shape "
                               f"{tuple(x.shape[1:])}; set distill.shape to [C, H, W]")
        tt = torch.full((x.shape[0],), float(t) * scale, dtype=dt, device=x.device)
        out = model(hidden_states=x.to(dt), encoder_hidden_states=cond.to(dt), timestep=tt,
                    encoder_attention_mask=None if mask is None else mask.to(x.device), return_dict=False)[0]
        return out
    return Teacher(spec, prov, call, device)


def check_pairing(spec: TeacherSpec, text_dim: int | None, shape: list[int]) -> None:
    """The teacher takes the text encoder's embeddings and ``distill.shape``'s channels; a
    :class:`TeacherError` naming both numbers and the fix otherwise."""
    if spec.text_dim is not None and text_dim is not None and spec.text_dim != text_dim:
        raise TeacherError(f"models.teacher ({spec.family}) takes {spec.text_dim}-wide text embeddings (its "
                           f"caption_channels), but models.text gives {text_dim}-wide ones; use the text encoder "
                           "the teacher was trained with, or a teacher config with that caption_channels")
    if spec.latent_channels is not None and shape and shape[0] != spec.latent_channels:
        raise TeacherError(f"distill.shape {list(shape)} has {shape[0]} channels, but models.teacher ({spec.family}) "
                           f"takes {spec.latent_channels}; set distill.shape to [{spec.latent_channels}, ...]")
