"""Image and video VAEs (diffusers) behind one interface.

``load_vae(family, ...)`` returns a :class:`VaeEncoder` whose ``encode`` turns pixels in
[-1, 1] into normalised latents (per ``spec.store``) and whose ``decode`` turns them back
into pixels in [-1, 1].

Two ways to get weights:

* ``pretrained="dir-or-repo"``: ``Class.from_pretrained(...)``; the weight files are
  hashed (``provenance.weights_sha256``) and the provenance says ``"pretrained"``.
* no ``pretrained``: ``Class(**config)`` with ``torch.manual_seed(0)`` from a named
  config (``"tiny"``: fast test-size models; ``"published"``: the published architecture,
  e.g. SD-VAE / Wan2.1 / LTX-Video) or an explicit dict. Provenance says
  ``"random-weights"``: such latents are not model-space data.

Family table (compression is derived from the config, see ``vae_config.compression``):

======  ======================  ==========  =======  ========  =========================
family  diffusers class         kind        C (pub)  spatial   temporal / normalisation
======  ======================  ==========  =======  ========  =========================
sd      AutoencoderKL           image_vae   4        8         scale 0.18215, shift 0
sdxl    AutoencoderKL           image_vae   4        8         scale 0.13025, shift 0
flux    AutoencoderKL           image_vae   16       8         scale 0.3611, shift 0.1159
wan     AutoencoderKLWan        video_vae   16       8         4x; (z-mean)/std (config)
ltx     AutoencoderKLLTXVideo   video_vae   128      32        8x; (z-mean)*sf/std (buffers)
ltx2    AutoencoderKLLTX2Video  video_vae   128      32        8x; (z-mean)*sf/std (buffers)
======  ======================  ==========  =======  ========  =========================
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import inspect
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch

from shardsmith.errors import UserError

from . import vae_config
from .spec import EncoderSpec, Provenance, check_pixel_shape, hash_pretrained, pretrained_kwargs
from .vae_config import CONFIGS, FAMILIES, resolve_config  # noqa: F401 - the family tables, re-exported
from .vae_config import compression as _compression
from .vae_config import latent_channels as _latent_channels

SEED = 0

# Defaults of the published AutoencoderKL-family normalisation, used only when a
# pretrained config lacks scaling_factor (it never should).
_KL_SCALE = {"sd": (0.18215, 0.0), "sdxl": (0.13025, 0.0), "flux": (0.3611, 0.1159)}


def _torch_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    name = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16", "half": "float16"}.get(dtype, dtype)
    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype):
        raise ValueError(f"unknown dtype {dtype!r}")
    return dt


def _dtype_name(dt: torch.dtype) -> str:
    return str(dt).replace("torch.", "")


@contextlib.contextmanager
def seeded_init(device: str | torch.device = "cpu") -> Iterator[torch.device]:
    """Build random-weight modules under ``torch.manual_seed(SEED)`` straight on ``device``.

    On CPU this is exactly the old behaviour (CPU RNG forked and seeded, modules built on
    the CPU). On an accelerator the modules' parameters are allocated *and initialised* on
    that device (``with torch.device(device)``): no host copy of the fp32 weights (~20 GB
    for a 5B-parameter text encoder) and no minutes of single-host-thread init. The init is
    then drawn from that device's seeded RNG, so the values differ from a CPU build (still
    seeded and reproducible on that device type); the global RNG states of the CPU and of
    the device are restored afterwards.
    """
    dev = torch.device(device)
    fork: list[int] = []
    if dev.type == "cuda" and torch.cuda.is_available():
        fork = list(range(torch.cuda.device_count()))
    with torch.random.fork_rng(devices=fork):
        torch.manual_seed(SEED)
        if dev.type == "cpu":
            yield dev
        else:
            with torch.device(dev):
                yield dev


def seeded_statistics(model, notes: list[str]) -> None:
    """Give a tiny random-weight model's ``latents_mean`` / ``latents_std`` buffers non-trivial seeded
    values, so the normalisation shows in tests (real checkpoints carry their own); drawn on the CPU
    on every device, so they are the same everywhere. Says so in ``notes``."""
    import torch

    n = model.latents_mean.shape[0]
    g = torch.Generator().manual_seed(SEED + 1)
    model.latents_mean.copy_(torch.randn(n, generator=g, device="cpu") * 0.1)
    model.latents_std.copy_(0.5 + torch.rand(n, generator=g, device="cpu"))
    notes.append("tiny config: latents_mean/std buffers set to seeded random statistics")


def device_init_note(device: str | torch.device) -> str | None:
    """Provenance note for random weights initialised on a non-CPU device (None on CPU)."""
    dev = torch.device(device)
    if dev.type == "cpu":
        return None
    return (f"random init drawn on {dev.type} (torch.manual_seed({SEED}) on that device): values differ from "
            "a CPU build with the same seed")


def _diffusers_class(family: str, lean: bool = False):
    from shardsmith.encode.diffusers_import import model_class

    return model_class(FAMILIES[family]["cls"], lean=lean)


class ModelConfigError(UserError):
    """A ``config`` dict that its diffusers model class cannot be built from (exit code 2)."""


#: what a diffusers constructor raises for a config value it cannot take (a negative or fractional size: torch's
#: RuntimeError / ValueError; a string or a number where a list goes: TypeError, IndexError ...)
_BUILD_ERRORS = (TypeError, ValueError, RuntimeError, IndexError, KeyError, AttributeError, ArithmeticError,
                 AssertionError)


def config_keys(cls) -> list[str] | None:
    """The keywords ``cls.__init__`` takes (its config keys), None when it takes any (``**kwargs``)."""
    params = list(inspect.signature(cls.__init__).parameters.values())[1:]
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return None
    return [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


def build_from_config(cls, cfg: dict, key: str, *, meta: bool = False):
    """``cls(**cfg)`` for a ``config`` dict given as the recipe's ``key`` (``models.vae.config``, ...): a key
    ``cls.__init__`` does not take, and any value its constructor refuses (a negative size, a string where
    a list of sizes goes), is a :class:`ModelConfigError` naming ``key``, the class and the fix. ``meta``: built
    on torch's meta device (no memory, no weights, milliseconds): the check made before the plan."""
    known = config_keys(cls)
    # (keys starting with "_", as _class_name and _diffusers_version in every HF config.json, are the config's
    # bookkeeping: diffusers' register_to_config drops them)
    unknown = [] if known is None else [k for k in cfg if k not in known and not str(k).startswith("_")]
    if unknown:
        near = {k: difflib.get_close_matches(str(k), known, n=1) for k in unknown}
        hints = "; ".join(f"{k!r}: did you mean {m[0]!r}?" for k, m in near.items() if m)
        raise ModelConfigError(f"{key}: {cls.__name__} takes no key {', '.join(repr(k) for k in unknown)}"
                               f"{f' ({hints})' if hints else ''}; its keys are {', '.join(known)}. Fix or remove "
                               "the key, or use a named config (tiny, published)")
    oom = getattr(torch, "OutOfMemoryError", None)
    try:
        if meta:
            with warnings.catch_warnings():  # (torch's "zero-element tensors" note for a size 0: refused below)
                warnings.simplefilter("ignore")
                with torch.device("meta"):
                    return cls(**cfg)
        return cls(**cfg)
    except _BUILD_ERRORS as exc:
        if oom is not None and isinstance(exc, oom):
            raise
        shown = {k: cfg[k] for k in list(cfg)[:12]}
        raise ModelConfigError(f"{key} {shown}{' ...' if len(cfg) > 12 else ''}: {cls.__name__} cannot be built "
                               f"from it ({type(exc).__name__}: {exc}); give each key a value of the kind the class "
                               "takes (positive whole sizes, lists of them where the named configs have lists), or "
                               "use a named config (tiny, published)") from None


def check_config(family: str, config: dict, *, lean: bool = False) -> None:
    """``models.vae.config`` given as a dict, checked before the plan: its keys are ``family``'s class's, the
    class builds from it (on the meta device: :func:`build_from_config`) and it gives a VAE of at least one
    latent channel and compression factors of at least 1; a :class:`ModelConfigError` otherwise."""
    key = "models.vae.config"
    cfg, _ = resolve_config(family, config)
    build_from_config(_diffusers_class(family, lean=lean), cfg, key, meta=True)
    try:
        spatial, temporal = _compression(family, cfg)
        channels = _latent_channels(family, cfg)
    except (TypeError, ValueError, KeyError, IndexError) as exc:
        raise ModelConfigError(f"{key}: its compression factors cannot be read from it ({type(exc).__name__}: "
                               f"{exc}); fix the value, or use a named config (tiny, published)") from None
    for what, value in (("latent channels", channels), ("spatial compression", spatial),
                        ("temporal compression", temporal)):
        if not (isinstance(value, (int, float)) and value >= 1):
            raise ModelConfigError(f"{key}: it gives a VAE with {what} {value!r}; every size must be at least 1 (e.g. "
                                   "latent_channels, patch_size); fix the value, or use a named config (tiny, "
                                   "published)")


def vae_geometry(family: str, config: str | dict = "published") -> dict:
    """Pure geometry of a VAE family without loading it: ``{"kind", "latent_channels",
    "spatial", "temporal"}``. For the Transform stage (bucket sizes, F = 1 + k*temporal)."""
    return vae_config.geometry(family, config)


def _normalisation(family: str, model) -> dict | None:
    cfg = model.config
    if FAMILIES[family]["cls"] == "AutoencoderKL":
        scale = cfg.get("scaling_factor")
        shift = cfg.get("shift_factor")
        dscale, dshift = _KL_SCALE[family]
        return {
            "type": "scale_shift",
            "scale": float(dscale if scale is None else scale),
            "shift": float(dshift if shift is None else shift),
        }
    if family == "wan":
        return {"type": "mean_std", "mean": [float(v) for v in cfg["latents_mean"]],
                "std": [float(v) for v in cfg["latents_std"]]}
    # LTX: buffers + config scaling_factor
    norm = {"type": "mean_std",
            "mean": [float(v) for v in model.latents_mean.detach().float().cpu()],
            "std": [float(v) for v in model.latents_std.detach().float().cpu()]}
    sf = float(cfg.get("scaling_factor", 1.0) or 1.0)
    if sf != 1.0:
        norm["scale"] = sf
    return norm


def normalise(z: torch.Tensor, normalisation: dict | None) -> torch.Tensor:
    """Apply a spec normalisation to raw latents [B,C,...] (computed in float32)."""
    if normalisation is None:
        return z
    zf = z.float()
    if normalisation["type"] == "scale_shift":
        return (zf - normalisation["shift"]) * normalisation["scale"]
    mean, std = _mean_std(normalisation, zf)
    return (zf - mean) * normalisation.get("scale", 1.0) / std


def denormalise(z: torch.Tensor, normalisation: dict | None) -> torch.Tensor:
    """Inverse of :func:`normalise`."""
    if normalisation is None:
        return z
    zf = z.float()
    if normalisation["type"] == "scale_shift":
        return zf / normalisation["scale"] + normalisation["shift"]
    mean, std = _mean_std(normalisation, zf)
    return zf * std / normalisation.get("scale", 1.0) + mean


def _mean_std(normalisation: dict, z: torch.Tensor):
    shape = (1, -1) + (1,) * (z.ndim - 2)
    mean, std = _stats_on(tuple(normalisation["mean"]), tuple(normalisation["std"]), z.device)
    if mean.shape[0] != z.shape[1]:
        raise ValueError(f"normalisation has {mean.shape[0]} channels, latents have {z.shape[1]}")
    return mean.view(shape), std.view(shape)


@functools.lru_cache(maxsize=64)
def _stats_on(mean: tuple[float, ...], std: tuple[float, ...],
              device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """A normalisation's per-channel mean and std as float32 tensors on ``device``, made once: a tensor made from a
    list on a GPU is a copy the host waits for, behind every batch queued before it (each batch's latents would
    wait for its own forward before the host could queue anything after it, its captions' text encoder included).
    Read only: never written in place; made outside inference mode (the packaged encoder normalises inside it), so
    that a later graph that records for backward (a decode with gradients) may use them."""
    with torch.inference_mode(False):
        return (torch.tensor(mean, dtype=torch.float32, device=device),
                torch.tensor(std, dtype=torch.float32, device=device))


@dataclass
class VaeEncoder:
    """A loaded VAE with its spec and provenance. Use :func:`load_vae` to build one, or
    :func:`~shardsmith.encode.packaged_encoder.from_cache` for a compiled image VAE whose packages are cached
    (``model`` is then built, by ``build_model``, only when something needs it: an eager batch, a shape without
    a package, a decode)."""

    spec: EncoderSpec
    provenance: Provenance
    model: Any
    place: str | None = None  # the device of a VAE not built yet
    build_model: Callable[[], Any] | None = field(default=None, repr=False)
    weight_bytes: int | None = None  # the parameters' bytes of a VAE not built yet
    packages: Any = None  # encode.packaged_encoder.PackagedEncoder: the encoder network compiled ahead of time

    def net(self):
        """The diffusers model, built now where it was not."""
        if self.model is None:
            self.model = self.build_model()
        return self.model

    @property
    def device(self) -> torch.device:
        if self.model is None:
            return torch.device(self.place)
        return next(self.model.parameters()).device

    @property
    def torch_dtype(self) -> torch.dtype:
        return _torch_dtype(self.spec.dtype)

    def check_input(self, x: torch.Tensor) -> None:
        if not torch.is_tensor(x):
            raise TypeError(f"expected a torch.Tensor of pixels, got {type(x).__name__}")
        if not x.is_floating_point():
            raise TypeError(f"expected float pixels in [-1, 1], got dtype {x.dtype}")
        if x.ndim < 2:
            raise ValueError(f"expected batched pixels, got shape {tuple(x.shape)}")
        check_pixel_shape(self.spec, tuple(x.shape[1:]))

    def compile(self, mode: str | None = "max-autotune-no-cudagraphs", backend: str = "inductor") -> None:
        """``torch.compile`` the encoder network in place (lazily: the first call compiles).

        Only the encoder (and its quant conv, when separate and small, stays eager): the VAE's
        decoder and the posterior arithmetic are untouched. Fixed shapes (``dynamic=False``):
        each bucket compiles once. Inductor compiles ``mode`` in its deterministic mode
        (:func:`~shardsmith.encode.compile.inductor_options`): the same kernels, so the same bytes, in every
        process. Do not call the compiled encoder under a dispatch mode such
        as ``FlopCounterMode``: dynamo then runs it eagerly for the rest of the process. An image VAE with
        ``packages`` runs them instead (AOTInductor: compiled ahead of time, kept in the compile cache)."""
        from .compile import inductor_options

        if self.packages is not None and backend == "inductor" and self.packages.usable():  # (packaged_encoder.py)
            self.packages.active = True
            return
        target = getattr(self.net(), "encoder", None)
        if not isinstance(target, torch.nn.Module):
            target = self.model
        kw: dict[str, Any] = {"backend": backend, "dynamic": False}
        if backend == "inductor":
            kw["options"] = inductor_options(mode)
        target.compile(**kw)

    def posterior(self, x: torch.Tensor):
        """The model's raw ``DiagonalGaussianDistribution`` for pixels ``x`` (no normalisation)."""
        self.check_input(x)
        x = x.to(device=self.device, dtype=self.torch_dtype)
        with torch.inference_mode():
            return self.net().encode(x).latent_dist

    def encode(self, x: torch.Tensor, *, generator: torch.Generator | None = None) -> torch.Tensor:
        """Pixels in [-1, 1] -> latents per ``spec.store`` (on the model device, ``spec.dtype``).

        Image VAEs take ``[B,3,H,W]``, video VAEs ``[B,3,F,H,W]`` with ``F = 1 + k*temporal``.
        ``store="sample"`` draws with ``generator`` (a ``torch.Generator(seed=0)`` on the
        model device if None, so the result is reproducible).
        """
        if self.packages is not None and self.packages.active and not getattr(self.model, "use_tiling", False):
            return self._encode_packaged(x, generator)  # (tiled, after running out of memory: diffusers' tiles)
        post = self.posterior(x)
        store = self.spec.store
        if store == "mean_std":
            out = torch.cat([post.mean, post.std], dim=1)  # raw, unnormalised (EDM2 layout)
        elif store == "sample":
            if generator is None:
                generator = torch.Generator(device=self.device).manual_seed(SEED)
            out = normalise(post.sample(generator=generator), self.spec.normalisation)
        else:
            out = normalise(post.mean, self.spec.normalisation)
        return out.to(self.torch_dtype)

    def _encode_packaged(self, x: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        """:meth:`encode` through the packaged encoder network: its moments, then the posterior
        (:mod:`~shardsmith.encode.posterior`, diffusers' arithmetic) and the store as :meth:`encode` does."""
        from . import posterior

        self.check_input(x)
        x = x.to(device=self.device, dtype=self.torch_dtype)
        with torch.inference_mode():
            moments = self.packages(x)
            store = self.spec.store
            if store == "mean_std":
                out = torch.cat(posterior.mean_std(moments), dim=1)
            elif store == "sample":
                if generator is None:
                    generator = torch.Generator(device=self.device).manual_seed(SEED)
                out = normalise(posterior.sample(moments, generator), self.spec.normalisation)
            else:
                out = normalise(posterior.mean_std(moments)[0], self.spec.normalisation)
            return out.to(self.torch_dtype)

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        """Latents as produced by :meth:`encode` -> pixels in [-1, 1] (clamped), ``spec.dtype``.

        For ``store="mean_std"`` the first C channels (the raw mean) are decoded.
        """
        c = self.spec.latent_channels
        expected_ndim = 4 if self.spec.kind == "image_vae" else 5
        if z.ndim != expected_ndim:
            raise ValueError(f"expected latents with {expected_ndim} dims, got shape {tuple(z.shape)}")
        if self.spec.store == "mean_std":
            if z.shape[1] != 2 * c:
                raise ValueError(f"mean_std latents need {2 * c} channels, got {z.shape[1]}")
            raw = z[:, :c].float()
        else:
            if z.shape[1] != c:
                raise ValueError(f"latents need {c} channels, got {z.shape[1]}")
            raw = denormalise(z.to(self.device), self.spec.normalisation)
        raw = raw.to(device=self.device, dtype=self.torch_dtype)
        with torch.inference_mode():
            out = self.net().decode(raw).sample
        return out.clamp(-1.0, 1.0).to(self.torch_dtype)

    def latent_shape(self, pixel_shape) -> tuple[int, ...]:
        """Latent shape (no batch) of ``encode`` for a pixel shape (no batch)."""
        return self.spec.latent_shape(pixel_shape)


def load_vae(
    family: str,
    *,
    pretrained: str | None = None,
    subfolder: str | None = None,
    revision: str | None = None,
    config: str | dict = "tiny",
    dtype: str = "float32",
    device: str | torch.device = "cpu",
    cache_dir: str | None = None,
    store: str = "mean",
) -> VaeEncoder:
    """Load a VAE of ``family`` (see ``FAMILIES``).

    With ``pretrained`` (local folder or hub repo id; offline this must already be on disk
    or in the HF cache, ``cache_dir`` to point elsewhere) the real weights are loaded and
    hashed. Without it, a model with
    seeded random weights is built from ``config`` ("tiny", "published" or a dict) and
    labelled ``"random-weights"``.
    """
    if family not in FAMILIES:
        raise ValueError(f"unknown VAE family {family!r}; known: {sorted(FAMILIES)}")
    if store not in ("mean", "mean_std", "sample"):
        raise ValueError(f"store must be 'mean', 'mean_std' or 'sample', got {store!r}")
    cls = _diffusers_class(family)
    tdt = _torch_dtype(dtype)
    notes: list[str] = []

    if pretrained is not None:
        kw = pretrained_kwargs("torch_dtype", tdt, subfolder, revision, cache_dir)
        model = cls.from_pretrained(str(pretrained), **kw)
        sha, files, resolved, hnotes = hash_pretrained(str(pretrained), subfolder, revision, cache_dir)
        notes += hnotes
        cfg = dict(model.config)
        prov = Provenance(
            cls=cls.__name__, weights="pretrained", path_or_repo=str(pretrained), subfolder=subfolder,
            revision=resolved if resolved else revision, weights_sha256=sha, config=cfg,
            weight_files=files, notes=notes,
        )
    else:
        cfg_in, cfg_name = resolve_config(family, config)
        if isinstance(config, dict):  # a dict the class cannot take: one message naming the key, before any memory
            check_config(family, config)
        # Built (fp32, as the class initialises it) directly on the target device, then cast:
        # a published model never passes through host memory.
        with seeded_init(device):
            model = cls(**cfg_in)
            if family in ("ltx", "ltx2") and cfg_name == "tiny":
                seeded_statistics(model, notes)
        if next(model.parameters()).dtype != tdt:
            # diffusers' own ``to`` only adds a warning here, about its float32 modules, even when there are none
            # ("should be kept in float32: []"); torch's cast is the same cast
            model = model.to(tdt) if getattr(model, "_keep_in_fp32_modules", None) else torch.nn.Module.to(model, tdt)
        notes.append("random weights (torch.manual_seed(0)): latents are NOT model-space data")
        if (note := device_init_note(device)) is not None:
            notes.append(note)
        prov = Provenance(
            cls=cls.__name__, weights="random-weights", config=dict(model.config), config_name=cfg_name,
            seed=SEED, notes=notes,
        )

    model = model.to(device).eval().requires_grad_(False)
    cfg = dict(model.config)
    spatial, temporal = _compression(family, cfg)
    kind = FAMILIES[family]["kind"]
    spec = EncoderSpec(
        kind=kind, family=family, dtype=_dtype_name(tdt), latent_channels=_latent_channels(family, cfg),
        spatial=spatial, temporal=temporal if kind == "video_vae" else 1,
        normalisation=_normalisation(family, model), store=store,
    )
    # Cross-check with the model's own attributes when diffusers exposes them.
    for attr, ours in (("spatial_compression_ratio", spatial), ("temporal_compression_ratio", temporal)):
        theirs = getattr(model, attr, None)
        if isinstance(theirs, int) and theirs != ours:
            prov.notes.append(f"diffusers {attr}={theirs} differs from the stride-derived {ours}; using {ours}")
    return VaeEncoder(spec=spec, provenance=prov, model=model)
