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

Family table (compression is derived from the config, see ``_compression``):

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
import copy
from dataclasses import dataclass
from typing import Any, Iterator

import torch

from .spec import EncoderSpec, Provenance, check_pixel_shape, hash_pretrained, pretrained_kwargs

SEED = 0

_KL_DOWN = "DownEncoderBlock2D"
_KL_UP = "UpDecoderBlock2D"

# Named configs. "tiny" configs follow diffusers' own unit-test configs (small channel
# counts) but keep each family's real compression factors where that is cheap (LTX tiny
# is 32x / 8x with 128 channels, like the real LTX latent layout).
CONFIGS: dict[str, dict[str, dict[str, Any]]] = {
    "sd": {
        "tiny": dict(
            block_out_channels=(8, 8, 8, 8), down_block_types=(_KL_DOWN,) * 4, up_block_types=(_KL_UP,) * 4,
            latent_channels=4, norm_num_groups=4, layers_per_block=1, scaling_factor=0.18215,
        ),
        "published": dict(  # stabilityai/sd-vae-ft-mse
            block_out_channels=(128, 256, 512, 512), down_block_types=(_KL_DOWN,) * 4,
            up_block_types=(_KL_UP,) * 4, latent_channels=4, layers_per_block=2, norm_num_groups=32,
            sample_size=512, scaling_factor=0.18215,
        ),
    },
    "sdxl": {
        "tiny": dict(
            block_out_channels=(8, 8, 8, 8), down_block_types=(_KL_DOWN,) * 4,
            up_block_types=(_KL_UP,) * 4, latent_channels=4, norm_num_groups=4, layers_per_block=1,
            scaling_factor=0.13025,
        ),
        "published": dict(  # stabilityai/sdxl-vae
            block_out_channels=(128, 256, 512, 512), down_block_types=(_KL_DOWN,) * 4,
            up_block_types=(_KL_UP,) * 4, latent_channels=4, layers_per_block=2, norm_num_groups=32,
            sample_size=1024, scaling_factor=0.13025, force_upcast=True,
        ),
    },
    "flux": {
        "tiny": dict(
            block_out_channels=(16, 16, 16, 16), down_block_types=(_KL_DOWN,) * 4,
            up_block_types=(_KL_UP,) * 4, latent_channels=16, norm_num_groups=4, layers_per_block=1,
            scaling_factor=0.3611, shift_factor=0.1159, use_quant_conv=False, use_post_quant_conv=False,
        ),
        "published": dict(  # black-forest-labs/FLUX.1-dev vae/
            block_out_channels=(128, 256, 512, 512), down_block_types=(_KL_DOWN,) * 4,
            up_block_types=(_KL_UP,) * 4, latent_channels=16, layers_per_block=2, norm_num_groups=32,
            sample_size=1024, scaling_factor=0.3611, shift_factor=0.1159, use_quant_conv=False,
            use_post_quant_conv=False, force_upcast=True,
        ),
    },
    "wan": {
        "tiny": dict(base_dim=3, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
                     temperal_downsample=[False, True, True]),
        "published": {},  # AutoencoderKLWan() defaults == Wan2.1 VAE (incl. latents_mean/std)
    },
    "ltx": {
        "tiny": dict(
            in_channels=3, out_channels=3, latent_channels=128, block_out_channels=(8, 8, 8, 8),
            decoder_block_out_channels=(8, 8, 8, 8), layers_per_block=(1, 1, 1, 1, 1),
            decoder_layers_per_block=(1, 1, 1, 1, 1), spatio_temporal_scaling=(True, True, True, False),
            decoder_spatio_temporal_scaling=(True, True, True, False), decoder_inject_noise=(False,) * 5,
            upsample_residual=(False,) * 4, upsample_factor=(1,) * 4, timestep_conditioning=False,
            patch_size=4, patch_size_t=1, encoder_causal=True, decoder_causal=False,
        ),
        "published": {},  # AutoencoderKLLTXVideo() defaults == LTX-Video 0.9.0 VAE
    },
    "ltx2": {
        "tiny": dict(
            in_channels=3, out_channels=3, latent_channels=128, block_out_channels=(8, 8, 8, 8),
            decoder_block_out_channels=(8, 16, 32), layers_per_block=(1, 1, 1, 1, 1),
            decoder_layers_per_block=(1, 1, 1, 1), spatio_temporal_scaling=(True, True, True, True),
            decoder_spatio_temporal_scaling=(True, True, True), decoder_inject_noise=(False,) * 4,
            downsample_type=("spatial", "temporal", "spatiotemporal", "spatiotemporal"),
            upsample_type=("spatiotemporal",) * 3, upsample_residual=(True,) * 3, upsample_factor=(2, 2, 2),
            timestep_conditioning=False, patch_size=4, patch_size_t=1, encoder_causal=True,
            decoder_causal=False, spatial_compression_ratio=32, temporal_compression_ratio=8,
        ),
        # AutoencoderKLLTX2Video() defaults (LTX-2 VAE); diffusers' derived
        # spatial/temporal_compression_ratio attributes say 64/16 for these defaults, but the
        # real strides are 32/8, so pin them.
        "published": dict(spatial_compression_ratio=32, temporal_compression_ratio=8),
    },
}

FAMILIES: dict[str, dict[str, str]] = {
    "sd": dict(cls="AutoencoderKL", kind="image_vae", desc="Stable Diffusion 1.x/2.x VAE (4ch, 8x, scale 0.18215)"),
    "sdxl": dict(cls="AutoencoderKL", kind="image_vae", desc="SDXL VAE (4ch, 8x, scale 0.13025)"),
    "flux": dict(cls="AutoencoderKL", kind="image_vae", desc="FLUX.1 VAE (16ch, 8x, scale 0.3611, shift 0.1159)"),
    "wan": dict(cls="AutoencoderKLWan", kind="video_vae", desc="Wan 2.1 video VAE (16ch, 8x spatial, 4x temporal, (z-mean)/std)"),
    "ltx": dict(cls="AutoencoderKLLTXVideo", kind="video_vae", desc="LTX-Video VAE (128ch, 32x spatial, 8x temporal)"),
    "ltx2": dict(cls="AutoencoderKLLTX2Video", kind="video_vae", desc="LTX-2 video VAE (128ch, 32x spatial, 8x temporal)"),
}

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


def device_init_note(device: str | torch.device) -> str | None:
    """Provenance note for random weights initialised on a non-CPU device (None on CPU)."""
    dev = torch.device(device)
    if dev.type == "cpu":
        return None
    return (f"random init drawn on {dev.type} (torch.manual_seed({SEED}) on that device): values differ from "
            "a CPU build with the same seed")


def _diffusers_class(family: str):
    import diffusers

    return getattr(diffusers, FAMILIES[family]["cls"])


def _tup(v, n=None):
    if isinstance(v, bool):
        return (v,) * (n or 1)
    return tuple(v)


def _compression(family: str, cfg: dict) -> tuple[int, int]:
    """(spatial, temporal) compression derived from a diffusers config dict."""
    if FAMILIES[family]["cls"] == "AutoencoderKL":
        return 2 ** (len(cfg.get("block_out_channels", (64,))) - 1), 1
    if family == "wan":
        patch = cfg.get("patch_size") or 1
        spatial = 2 ** (len(cfg.get("dim_mult", [1, 2, 4, 4])) - 1) * patch
        temporal = 2 ** sum(bool(t) for t in cfg.get("temperal_downsample", [False, True, True]))
        return spatial, temporal
    # LTX / LTX-2: strides of each down block that has spatio_temporal_scaling, times patch.
    n_blocks = len(cfg.get("block_out_channels", (1, 1, 1, 1)))
    scaling = _tup(cfg.get("spatio_temporal_scaling", (True, True, True, False)), n_blocks)
    dtypes = _tup(cfg.get("downsample_type", ("conv",) * n_blocks))
    s_exp = t_exp = 0
    for i, on in enumerate(scaling):
        if not on:
            continue
        kind = dtypes[i] if i < len(dtypes) else "conv"
        if kind in ("conv", "spatiotemporal"):
            s_exp += 1
            t_exp += 1
        elif kind == "spatial":
            s_exp += 1
        elif kind == "temporal":
            t_exp += 1
        else:
            raise ValueError(f"unknown LTX downsample_type {kind!r}")
    spatial = cfg.get("patch_size", 4) * 2**s_exp
    temporal = cfg.get("patch_size_t", 1) * 2**t_exp
    return spatial, temporal


def full_config(family: str, config: str | dict = "published") -> dict:
    """The complete constructor config (class defaults + named / explicit overrides),
    without building the model."""
    import inspect

    cfg, _ = resolve_config(family, config)
    cls = _diffusers_class(family)
    params = inspect.signature(cls.__init__).parameters
    full = {k: p.default for k, p in params.items()
            if k != "self" and p.default is not inspect.Parameter.empty}
    full.update(cfg)
    return full


def vae_geometry(family: str, config: str | dict = "published") -> dict:
    """Pure geometry of a VAE family without loading it: ``{"kind", "latent_channels",
    "spatial", "temporal"}``. For the Transform stage (bucket sizes, F = 1 + k*temporal)."""
    cfg = full_config(family, config)
    spatial, temporal = _compression(family, cfg)
    kind = FAMILIES[family]["kind"]
    return {"kind": kind, "latent_channels": _latent_channels(family, cfg), "spatial": spatial,
            "temporal": temporal if kind == "video_vae" else 1}


def _latent_channels(family: str, cfg: dict) -> int:
    if family == "wan":
        return int(cfg.get("z_dim", 16))
    return int(cfg.get("latent_channels", 4 if FAMILIES[family]["cls"] == "AutoencoderKL" else 128))


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
    mean = torch.tensor(normalisation["mean"], dtype=torch.float32, device=z.device).view(shape)
    std = torch.tensor(normalisation["std"], dtype=torch.float32, device=z.device).view(shape)
    if mean.shape[1] != z.shape[1]:
        raise ValueError(f"normalisation has {mean.shape[1]} channels, latents have {z.shape[1]}")
    return mean, std


@dataclass
class VaeEncoder:
    """A loaded VAE with its spec and provenance. Use :func:`load_vae` to build one."""

    spec: EncoderSpec
    provenance: Provenance
    model: Any

    @property
    def device(self) -> torch.device:
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
        each bucket compiles once. Do not call the compiled encoder under a dispatch mode such
        as ``FlopCounterMode``: dynamo then runs it eagerly for the rest of the process."""
        target = getattr(self.model, "encoder", None)
        if not isinstance(target, torch.nn.Module):
            target = self.model
        kw = {"backend": backend, "dynamic": False}
        if backend == "inductor" and mode:
            kw["mode"] = mode
        target.compile(**kw)

    def posterior(self, x: torch.Tensor):
        """The model's raw ``DiagonalGaussianDistribution`` for pixels ``x`` (no normalisation)."""
        self.check_input(x)
        x = x.to(device=self.device, dtype=self.torch_dtype)
        with torch.inference_mode():
            return self.model.encode(x).latent_dist

    def encode(self, x: torch.Tensor, *, generator: torch.Generator | None = None) -> torch.Tensor:
        """Pixels in [-1, 1] -> latents per ``spec.store`` (on the model device, ``spec.dtype``).

        Image VAEs take ``[B,3,H,W]``, video VAEs ``[B,3,F,H,W]`` with ``F = 1 + k*temporal``.
        ``store="sample"`` draws with ``generator`` (a ``torch.Generator(seed=0)`` on the
        model device if None, so the result is reproducible).
        """
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
            out = self.model.decode(raw).sample
        return out.clamp(-1.0, 1.0).to(self.torch_dtype)

    def latent_shape(self, pixel_shape) -> tuple[int, ...]:
        """Latent shape (no batch) of ``encode`` for a pixel shape (no batch)."""
        return self.spec.latent_shape(pixel_shape)


def resolve_config(family: str, config: str | dict) -> tuple[dict, str]:
    """(config dict, config name) for a family and a named or explicit config."""
    if family not in FAMILIES:
        raise ValueError(f"unknown VAE family {family!r}; known: {sorted(FAMILIES)}")
    if isinstance(config, dict):
        return copy.deepcopy(config), "custom"
    if config not in CONFIGS[family]:
        raise ValueError(f"unknown config {config!r} for {family}; known: {sorted(CONFIGS[family])} or a dict")
    return copy.deepcopy(CONFIGS[family][config]), config


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
        # Built (fp32, as the class initialises it) directly on the target device, then cast:
        # a published model never passes through host memory.
        with seeded_init(device):
            model = cls(**cfg_in)
            if family in ("ltx", "ltx2") and cfg_name == "tiny":
                # Non-trivial (seeded) statistics so normalisation is visible in tests;
                # real checkpoints carry their own in these buffers. Drawn on the CPU on
                # every device, so they are the same everywhere.
                c = model.latents_mean.shape[0]
                g = torch.Generator().manual_seed(SEED + 1)
                model.latents_mean.copy_(torch.randn(c, generator=g, device="cpu") * 0.1)
                model.latents_std.copy_(0.5 + torch.rand(c, generator=g, device="cpu"))
                notes.append("tiny config: latents_mean/std buffers set to seeded random statistics")
        if next(model.parameters()).dtype != tdt:
            model = model.to(tdt)
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
