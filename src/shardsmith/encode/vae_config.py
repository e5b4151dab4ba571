"""What a VAE family's config says, without torch, diffusers or weights.

The named configs (``CONFIGS``), the family table (``FAMILIES``) and the arithmetic that
derives the compression factors and latent channels from a diffusers config dict. Pure
and cheap to import, so a recipe's buckets are checked against the VAE before any model is
built (``shardsmith.precheck``); :mod:`shardsmith.encode.vae` builds the models from the
same tables, so the check and the loaded model cannot disagree.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from shardsmith.atomic import read_json
from shardsmith.errors import UserError

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

def resolve_config(family: str, config: str | dict) -> tuple[dict, str]:
    """(config dict, config name) for a family and a named or explicit config."""
    if family not in FAMILIES:
        raise ValueError(f"unknown VAE family {family!r}; known: {sorted(FAMILIES)}")
    if isinstance(config, dict):
        return copy.deepcopy(config), "custom"
    if config not in CONFIGS[family]:
        raise ValueError(f"unknown config {config!r} for {family}; known: {sorted(CONFIGS[family])} or a dict")
    return copy.deepcopy(CONFIGS[family][config]), config



def _tup(v, n=None):
    if isinstance(v, bool):
        return (v,) * (n or 1)
    return tuple(v)


def compression(family: str, cfg: dict) -> tuple[int, int]:
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


def latent_channels(family: str, cfg: dict) -> int:
    """Latent channels of a family's config (class defaults where the config is silent)."""
    if family == "wan":
        return int(cfg.get("z_dim", 16))
    return int(cfg.get("latent_channels", 4 if FAMILIES[family]["cls"] == "AutoencoderKL" else 128))


class ConfigFileError(UserError):
    """A pretrained model's config file (``config.json``, ``scheduler_config.json``) that is not a JSON object:
    not UTF-8, not JSON, JSON nested too deeply to read, or another JSON value."""


def read_config_file(path: str | Path, key: str) -> dict:
    """The JSON object in ``path``, a config file of the pretrained model of the recipe's ``key``
    (``models.vae``, ...); a :class:`ConfigFileError` naming ``<key>.pretrained``, the file, what is wrong and the
    fix when it is not one. ``OSError`` (not there, unreadable) passes on."""
    try:
        cfg = read_json(path)
    except ValueError as exc:  # (UnicodeDecodeError, JSONDecodeError, JSONNestingError)
        why = f"is not valid JSON ({exc})"
    else:
        if isinstance(cfg, dict):
            return cfg
        kind = {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(type(cfg), "a number")
        why = f"holds {kind}, not a JSON object"
    raise ConfigFileError(f"{key}.pretrained: {path} {why}; it must be the model's config as save_pretrained writes "
                          "it (a JSON object of the model's settings): fix or replace the file (save or download the "
                          f"model again), or point {key}.pretrained at another model")


def pretrained_config(pretrained: str, subfolder: str | None = None, revision: str | None = None,
                      cache_dir: str | None = None, *, key: str = "models.vae") -> dict | None:
    """The ``config.json`` of a pretrained VAE as found on disk: in a local folder or in the
    Hugging Face cache (never the network, never the weights). None when it is not there; a file there that is
    not a JSON object is a :class:`ConfigFileError` naming ``<key>.pretrained`` and the file."""
    local = Path(pretrained).expanduser()
    if local.exists():
        path = local / (subfolder or "") / "config.json"
    else:
        try:
            from huggingface_hub import try_to_load_from_cache

            hit = try_to_load_from_cache(pretrained, f"{subfolder}/config.json" if subfolder else "config.json",
                                         cache_dir=cache_dir, revision=revision)
        except (ImportError, ValueError):  # no hub client, or not a repo id
            return None
        if not isinstance(hit, str):
            return None
        path = Path(hit)
    try:
        return read_config_file(path, key)
    except OSError:
        return None


def geometry(family: str, config: str | dict = "published", *, pretrained: str | None = None,
             subfolder: str | None = None, revision: str | None = None) -> dict[str, Any] | None:
    """``{"kind", "latent_channels", "spatial", "temporal"}`` of a VAE without loading it: from the
    named or explicit ``config``, or with ``pretrained`` from that model's ``config.json`` on disk
    (None when it is not on disk). Image VAEs have temporal 1."""
    if pretrained is not None:
        cfg = pretrained_config(pretrained, subfolder, revision)
        if cfg is None:
            return None
    else:
        cfg, _ = resolve_config(family, config)
    spatial, temporal = compression(family, cfg)
    kind = FAMILIES[family]["kind"]
    return {"kind": kind, "latent_channels": latent_channels(family, cfg), "spatial": spatial,
            "temporal": temporal if kind == "video_vae" else 1}
