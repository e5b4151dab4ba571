"""The teacher of ``shardsmith distill``: one more encoder, run for several solver steps.

Contract
- ``load_teacher(family, ...)`` returns a :class:`Teacher`: ``spec`` (``TeacherSpec``: family,
  parameterisation, dtype, latent channels, the text-embedding width it takes) and ``provenance``
  (:class:`~shardsmith.encode.spec.Provenance`; ``random-weights`` for a model built from a config).
- ``Teacher.predict(x, t, cond, mask)``: the model's raw output on a batch: the velocity (``flow``) or
  the denoised sample (``edm``), float32, shaped like ``x``. ``x``: ``[B, C, (T,) H, W]`` float32;
  ``t``: one time for the batch (flow ``t``, edm ``sigma``); ``cond``: ``[B, L, D]``; ``mask``: ``[B, L]``.
- Families: ``callable`` (``entry_point`` ``package.module:function``, called as ``f(x, t [B], cond)``;
  its provenance names the function and the sha256 of its module's source), ``sana`` (diffusers
  ``SanaTransformer2DModel``, flow matching, the model takes ``t * 1000`` as the Sana pipeline does) and
  ``unet`` (diffusers ``UNet2DConditionModel``, Stable Diffusion's epsilon / v prediction on a VP
  schedule, used as EDM's denoiser: :func:`vp_denoiser`); the diffusers ones ``from_pretrained`` with
  ``pretrained``, else the ``tiny`` / ``published`` config or a dict, with random weights.
- ``teacher_settings(...)``: the latent channels and text width from the config alone (no model
  built), for the precheck; ``None`` for a pretrained config that is not on disk.
- An entry point that cannot be imported or is not callable is a :class:`TeacherError` naming it; so is a
  ``predict`` whose model returns something other than a tensor (None, a numpy array) or another shape.
- ``call_signature(fn)``: the entry point's signature, or None where Python cannot read it (a builtin or
  C-implemented callable, a callable object whose ``__signature__`` or attributes raise). The precheck checks
  a readable one takes ``(x, t, cond)``; an unreadable one is accepted, and its first call failing (any
  ``Exception`` but running out of memory) is a :class:`TeacherError` naming it and the fix instead of a
  traceback. A callable object (no ``__qualname__``) is named in the provenance by its class.
- ``check_config(family, config)``: a ``config`` dict, checked before the plan against the family's class (its
  ``__init__``'s keywords, and a build on the meta device); a ``ModelConfigError`` (exit 2) naming
  ``models.teacher.config`` otherwise. A random-weight teacher built from a dict is checked so too.
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
from .vae import SEED, _torch_dtype, build_from_config, device_init_note, seeded_init

CONFIG_KEY = "models.teacher.config"


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


#: UNet2DConditionModel configs: ``tiny`` for tests (MiniLM's 384-wide embeddings), ``published``: Stable
#: Diffusion 1.5's UNet (320/640/1280/1280 channels, 2 layers a block, 768-wide CLIP captions, 4 channels).
UNET_CONFIGS: dict[str, dict[str, Any]] = {
    "tiny": dict(sample_size=8, in_channels=4, out_channels=4, block_out_channels=(32, 64), layers_per_block=1,
                 down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
                 up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"), cross_attention_dim=384, attention_head_dim=8,
                 norm_num_groups=8),
    "published": dict(sample_size=64, in_channels=4, out_channels=4, block_out_channels=(320, 640, 1280, 1280),
                      layers_per_block=2, down_block_types=("CrossAttnDownBlock2D", "CrossAttnDownBlock2D",
                                                            "CrossAttnDownBlock2D", "DownBlock2D"),
                      up_block_types=("UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"),
                      cross_attention_dim=768, attention_head_dim=8, norm_num_groups=32),
}
#: Stable Diffusion's training noise schedule (DDPMScheduler): the VP schedule the UNet family assumes
#: unless a pretrained pipeline's scheduler/scheduler_config.json says otherwise.
SD_SCHEDULE = dict(num_train_timesteps=1000, beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
                   prediction_type="epsilon")


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

    @property
    def name(self) -> str:
        """What messages call the teacher: its entry point or pretrained path, else its family."""
        return self.provenance.path_or_repo or self.spec.family

    def predict(self, x: torch.Tensor, t: float, cond: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        out = self._fn(x, t, cond, mask)
        if not torch.is_tensor(out):
            what = "None (no return statement?)" if out is None else f"a {type(out).__module__}.{type(out).__name__}"
            raise TeacherError(f"teacher {self.name} returned {what} for a state of shape {tuple(x.shape)}; it must "
                               "return a torch.Tensor: the velocity (flow) or the denoised sample (edm), shaped like "
                               "its input (e.g. torch.from_numpy(out) for a numpy array)")
        if out.shape != x.shape:
            raise TeacherError(f"teacher {self.name} returned shape "
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


def call_signature(fn: Callable) -> inspect.Signature | None:
    """``inspect.signature(fn)``, or None where it cannot be read: reading it runs the object's own code (a
    ``__signature__`` property, a ``__getattr__``), so any error means "cannot tell", not a traceback."""
    try:
        return inspect.signature(fn)
    except Exception:  # noqa: BLE001 - ValueError / TypeError for builtins, anything from a user's object
        return None


def _callable_name(fn: Callable) -> str:
    """``module.qualname`` of a function, or of the class of a callable object (which has no ``__qualname__``)."""
    for obj in (fn, type(fn)):
        try:
            return f"{obj.__module__}.{obj.__qualname__}"
        except Exception:  # noqa: BLE001 - an object's __getattr__ may raise anything
            continue
    return type(fn).__name__


def _source_sha256(fn: Callable) -> str | None:
    try:
        return hashlib.sha256(inspect.getsource(inspect.getmodule(fn)).encode()).hexdigest()
    except (OSError, TypeError):
        return None


def named_config(family: str, config: str | dict[str, Any]) -> dict[str, Any]:
    """The architecture of a diffusers teacher: a named config of its family, or the dict given."""
    if isinstance(config, dict):
        return dict(config)
    table, cls = (SANA_CONFIGS, "SanaTransformer2DModel") if family == "sana" else (UNET_CONFIGS,
                                                                                    "UNet2DConditionModel")
    if config not in table:
        raise TeacherError(f"models.teacher.config {config!r}: {family} has the configs {sorted(table)} (or give "
                           f"a dict of {cls}'s config)")
    return dict(table[config])


def teacher_settings(family: str, *, config: str | dict[str, Any] = "tiny", pretrained: str | None = None,
                     subfolder: str | None = None) -> dict[str, Any] | None:
    """``{"latent_channels", "text_dim"}`` from the config (None where the callable decides or a
    pretrained config is not on disk)."""
    if family == "callable":
        return {"latent_channels": None, "text_dim": None}
    if pretrained is not None:
        from pathlib import Path

        from .vae_config import read_config_file

        cfg_file = Path(pretrained, subfolder or "", "config.json")
        if not cfg_file.is_file():
            return None
        cfg = read_config_file(cfg_file, "models.teacher")
    else:
        cfg = named_config(family, config)
    if family == "unet":
        return {"latent_channels": cfg.get("in_channels", 4), "text_dim": cfg.get("cross_attention_dim", 1280)}
    return {"latent_channels": cfg.get("in_channels", 32), "text_dim": cfg.get("caption_channels", 2304)}


def vp_sigmas(schedule: dict[str, Any]) -> torch.Tensor:
    """The training noise levels of a VP (DDPM) schedule in EDM's terms: sigma_t = sqrt((1 - abar_t) / abar_t),
    float64, one per training timestep (increasing)."""
    n, b0, b1 = schedule["num_train_timesteps"], schedule["beta_start"], schedule["beta_end"]
    kind = schedule.get("beta_schedule", "scaled_linear")
    if kind == "scaled_linear":
        betas = torch.linspace(b0 ** 0.5, b1 ** 0.5, n, dtype=torch.float64) ** 2
    elif kind == "linear":
        betas = torch.linspace(b0, b1, n, dtype=torch.float64)
    else:
        raise TeacherError(f"the teacher's scheduler has beta_schedule {kind!r}; the unet family takes linear or "
                           "scaled_linear")
    abar = torch.cumprod(1.0 - betas, 0)
    return ((1 - abar) / abar).sqrt()


def sigma_to_t(sigma: float, sigmas: torch.Tensor) -> float:
    """The (fractional) training timestep of noise level ``sigma``: linear in log sigma between the two
    nearest training levels (k-diffusion's rule), clamped to the schedule's range."""
    log_s, logs = torch.tensor(float(sigma), dtype=torch.float64).log(), sigmas.log()
    i = int(torch.searchsorted(logs, log_s).clamp(1, len(logs) - 1))
    w = float(((log_s - logs[i - 1]) / (logs[i] - logs[i - 1])).clamp(0, 1))
    return (i - 1) + w


def vp_denoiser(eps_model: Callable, schedule: dict[str, Any]) -> Callable:
    """EDM's denoiser ``D(x, sigma, cond)`` of a VP model trained on ``schedule``: the model sees
    ``x / sqrt(sigma^2 + 1)`` at the training timestep of ``sigma``; ``epsilon`` prediction gives
    ``x - sigma * eps``, ``v_prediction`` gives ``x / (sigma^2 + 1) - sigma / sqrt(sigma^2 + 1) * v``."""
    sigmas, kind = vp_sigmas(schedule), schedule.get("prediction_type", "epsilon")
    if kind not in ("epsilon", "v_prediction"):
        raise TeacherError(f"the teacher's scheduler has prediction_type {kind!r}; the unet family takes epsilon or "
                           "v_prediction")

    def denoise(x, sigma: float, cond, mask=None):
        c_in = 1.0 / (sigma ** 2 + 1) ** 0.5
        out = eps_model(x * c_in, sigma_to_t(sigma, sigmas), cond, mask).to(x.dtype)
        if kind == "epsilon":
            return x - sigma * out
        return x / (sigma ** 2 + 1) - sigma * c_in * out
    return denoise


def _schedule(pretrained: str | None, subfolder: str | None) -> tuple[dict[str, Any], str]:
    """The VP schedule of a pretrained pipeline (its ``scheduler/scheduler_config.json`` beside the
    UNet's folder), else Stable Diffusion's; and where it came from. A scheduler config that is not a JSON object
    is a :class:`~shardsmith.encode.vae_config.ConfigFileError` naming it (the precheck asks first)."""
    from pathlib import Path

    from .vae_config import read_config_file

    if pretrained is not None and subfolder:
        f = Path(pretrained) / "scheduler" / "scheduler_config.json"
        if f.is_file():
            cfg = read_config_file(f, "models.teacher")
            return {k: cfg.get(k, v) for k, v in SD_SCHEDULE.items()}, str(f)
    return dict(SD_SCHEDULE), "Stable Diffusion's DDPM schedule (scaled_linear 0.00085-0.012, 1000 steps, epsilon)"


def load_teacher(family: str, *, entry_point: str | None = None, parameterisation: str | None = None,
                 pretrained: str | None = None, subfolder: str | None = None, revision: str | None = None,
                 config: str | dict[str, Any] = "tiny", dtype: str = "float32", device: str = "cpu") -> Teacher:
    if family == "callable":
        fn = resolve_entry_point(entry_point or "")
        prov = Provenance(cls=_callable_name(fn), weights="pretrained", path_or_repo=entry_point,
                          weights_sha256=_source_sha256(fn),
                          notes=["a Python callable: weights_sha256 is the sha256 of its module's source"])
        spec = TeacherSpec("callable", parameterisation or "flow", dtype)
        dt = _torch_dtype(dtype)
        unchecked = [call_signature(fn) is None]  # (the precheck could not check it: its first call is the check)

        def call(x, t, cond, mask):
            tt = torch.full((x.shape[0],), float(t), dtype=dt, device=x.device)
            if not unchecked[0]:
                return fn(x.to(dt), tt, cond.to(dt))
            try:
                out = fn(x.to(dt), tt, cond.to(dt))
            except torch.OutOfMemoryError:
                raise
            except Exception as exc:  # noqa: BLE001 - the first call of an entry point no signature told about
                raise _first_call_error(entry_point or "", spec.parameterisation, exc) from exc
            unchecked[0] = False
            return out
        return Teacher(spec, prov, call, device)
    if family == "unet":
        return _load_unet(pretrained=pretrained, subfolder=subfolder, revision=revision, config=config, dtype=dtype,
                          device=device)
    if family != "sana":
        raise TeacherError(f"models.teacher.family {family!r}: use callable, sana or unet")
    from diffusers import SanaTransformer2DModel

    dt = _torch_dtype(dtype)
    model, prov = _diffusers_model(SanaTransformer2DModel, "SanaTransformer2DModel", pretrained=pretrained,
                                   subfolder=subfolder, revision=revision, config=config,
                                   cfg=named_config("sana", config) if pretrained is None else {}, dtype=dtype, device=device)
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


def _first_call_error(entry_point: str, parameterisation: str, exc: Exception) -> TeacherError:
    """The first call of a callable teacher whose signature could not be read failed."""
    name, t = ("velocity", "t") if parameterisation == "flow" else ("denoise", "sigma")
    return TeacherError(f"models.teacher.entry_point {entry_point!r}: its signature cannot be read (a builtin or "
                        f"C-implemented callable?), so it was not checked before the plan, and its first call as "
                        f"{name}(x, {t}, cond) (x [B, *shape], {t} [B], cond [B, L, D]) failed ({type(exc).__name__}: "
                        f"{exc}); point entry_point at a function that takes those three positional arguments, e.g. "
                        f"shardsmith.distill.gaussian:{name}, or wrap this one in a Python function "
                        f"def {name}(x, {t}, cond)")


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


def check_config(family: str, config: dict[str, Any]) -> None:
    """``models.teacher.config`` given as a dict, checked before the plan: its keys are the family's class's and
    the class builds from it (on the meta device); a :class:`~shardsmith.encode.vae.ModelConfigError` naming
    ``models.teacher.config`` otherwise."""
    from shardsmith.encode.diffusers_import import model_class

    cls = model_class("SanaTransformer2DModel" if family == "sana" else "UNet2DConditionModel")
    build_from_config(cls, named_config(family, config), CONFIG_KEY, meta=True)


def _diffusers_model(cls, name: str, *, pretrained, subfolder, revision, config: dict | str, cfg: dict, dtype: str,
                     device: str):
    """A diffusers model ``from_pretrained`` or built from ``cfg`` with seeded random weights, and its provenance."""
    dt = _torch_dtype(dtype)
    if pretrained is not None:
        model = cls.from_pretrained(pretrained, **pretrained_kwargs("torch_dtype", dt, subfolder, revision, None))
        sha, files, resolved, notes = hash_pretrained(pretrained, subfolder, revision)
        prov = Provenance(cls=name, weights="pretrained", path_or_repo=pretrained, subfolder=subfolder,
                          revision=resolved, config=dict(model.config), weights_sha256=sha, weight_files=files,
                          notes=notes)
        model = model.to(device)
    else:
        if isinstance(config, dict):  # a dict the class cannot take: one message naming the key, before any memory
            build_from_config(cls, cfg, CONFIG_KEY, meta=True)
        with seeded_init(device):
            model = cls(**cfg)
        from diffusers.utils import logging as dlog

        level = dlog.get_verbosity()
        dlog.set_verbosity_error()  # its "modules to keep in float32: []" note on .to(): none are
        try:
            model = model.to(dtype=dt)
        finally:
            dlog.set_verbosity(level)
        note = device_init_note(device)
        prov = Provenance(cls=name, weights="random-weights", config=dict(model.config),
                          config_name=config if isinstance(config, str) else "custom", seed=SEED,
                          notes=[note] if note else [])
    return model.eval().requires_grad_(False), prov


def _load_unet(*, pretrained, subfolder, revision, config, dtype: str, device: str) -> Teacher:
    """``family: unet``: a diffusers ``UNet2DConditionModel`` (epsilon or v prediction on a VP schedule),
    used as EDM's denoiser through :func:`vp_denoiser`."""
    from diffusers import UNet2DConditionModel

    model, prov = _diffusers_model(UNet2DConditionModel, "UNet2DConditionModel", pretrained=pretrained,
                                   subfolder=subfolder, revision=revision, config=config,
                                   cfg=named_config("unet", config) if pretrained is None else {}, dtype=dtype, device=device)
    schedule, where = _schedule(pretrained, subfolder)
    prov.notes.append(f"noise schedule: {where}")
    dt = _torch_dtype(dtype)

    @torch.inference_mode()
    def eps(x, t: float, cond, mask):
        tt = torch.full((x.shape[0],), float(t), dtype=torch.float32, device=x.device)
        return model(x.to(dt), tt, encoder_hidden_states=cond.to(dt), return_dict=False)[0]

    denoise = vp_denoiser(eps, schedule)

    def call(x, sigma, cond, mask):
        if x.dim() != 4:
            raise TeacherError(f"unet is an image model: its samples are [C, H, W], got a state of shape "
                               f"{tuple(x.shape[1:])}; set distill.shape to [C, H, W]")
        return denoise(x, sigma, cond, mask)
    cfg = model.config
    spec = TeacherSpec("unet", "edm", dtype, latent_channels=cfg.in_channels, text_dim=cfg.cross_attention_dim)
    return Teacher(spec, prov, call, device)
