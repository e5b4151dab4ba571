"""Typed descriptions of an encoder: what it produces (``EncoderSpec``) and where its
weights came from (``Provenance``).

Both serialise with ``.to_dict()`` into plain JSON-able dicts for ``manifest.json``.

Normalisation conventions (``EncoderSpec.normalisation``):

* ``{"type": "scale_shift", "scale": s, "shift": b}``: ``z' = (z - b) * s``
  (SD 0.18215 / 0, SDXL 0.13025 / 0, FLUX 0.3611 / 0.1159; ``AutoencoderKL.config``
  ``scaling_factor`` / ``shift_factor``).
* ``{"type": "mean_std", "mean": [...], "std": [...], "scale": k}``:
  ``z'[c] = (z[c] - mean[c]) * k / std[c]`` per channel. Wan uses ``k = 1`` with the
  config's ``latents_mean`` / ``latents_std``; LTX / LTX-2 use the model's
  ``latents_mean`` / ``latents_std`` buffers and ``k = config.scaling_factor``
  (exactly diffusers' ``LTXPipeline._normalize_latents``). ``scale`` is omitted when 1.
  An audio VAE (LTX-2's) normalises its patchified channels ``(c, f)`` -> ``c * F + f``: its
  ``mean`` / ``std`` have ``latent_channels x frequency_bins`` entries.
* ``None``: latents are stored raw.

Stored latents (``EncoderSpec.store``):

* ``"mean"`` (default): the posterior mean (= mode), normalised. Deterministic; what the
  LTX trainer caches and what FastGen's latent loaders expect.
* ``"sample"``: ``mean + std * eps`` (seeded generator), normalised.
* ``"mean_std"``: EDM2-style ``concat([mean, std], dim=1)`` of the **raw, unnormalised**
  posterior (2C channels). EDM2 / FastGen DiT draw ``mean + std * eps`` at train time and
  apply their own scaling there, so the normalisation is *not* applied to these arrays;
  the spec still records the normalisation the model family would use.
"""

from __future__ import annotations

import hashlib
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Literal

Kind = Literal["image_vae", "video_vae", "audio_vae", "text"]
Store = Literal["mean", "mean_std", "sample"]

KINDS = ("image_vae", "video_vae", "audio_vae", "text")
STORES = ("mean", "mean_std", "sample")


def _jsonable(value: Any) -> Any:
    """Best-effort conversion of config values (tuples, tensors, paths, dtypes) to JSON."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_jsonable(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "tolist"):  # torch / numpy
        return _jsonable(value.tolist())
    return str(value)


@dataclass
class EncoderSpec:
    """What an encoder produces.

    VAE fields: ``latent_channels``, ``spatial`` / ``temporal`` compression (temporal is 1
    for image VAEs), ``normalisation`` (see module doc), ``store``.
    Text fields: ``max_length``, ``dim``, ``padding_side``, ``pooled_dim`` (None when the
    family has no pooled vector), ``zero_padding`` (padded positions are set to exactly 0),
    ``hidden_states`` (which hidden states make ``emb``), ``audio_dim`` (the width of a second,
    audio embedding when the family makes one: LTX-2's feature extractor) and ``features`` (the
    feature extractor applied to the hidden states, e.g. ``ltx2-v1``; None for none).
    Audio-VAE fields (besides ``latent_channels`` and ``temporal``, latent steps per mel frame):
    ``sample_rate`` (Hz the encoder takes), ``hop_length``, ``n_fft``, ``mel_bins`` and
    ``frequency_bins`` (latent frequency bins).
    """

    kind: str
    family: str
    dtype: str = "float32"
    # --- VAEs
    latent_channels: int | None = None
    spatial: int | None = None
    temporal: int | None = None
    normalisation: dict | None = None
    store: str = "mean"
    # --- text encoders
    max_length: int | None = None
    dim: int | None = None
    padding_side: str | None = None
    pooled_dim: int | None = None
    zero_padding: bool | None = None
    hidden_states: str | None = None
    audio_dim: int | None = None
    features: str | None = None
    quantize: str | None = None  # int8 / fp8 weights (encode/quantize.py); None: full precision
    # --- audio VAEs
    sample_rate: int | None = None
    hop_length: int | None = None
    n_fft: int | None = None
    mel_bins: int | None = None
    frequency_bins: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"EncoderSpec.kind must be one of {KINDS}, got {self.kind!r}")
        if self.kind != "text" and self.store not in STORES:
            raise ValueError(f"EncoderSpec.store must be one of {STORES}, got {self.store!r}")
        if self.kind == "image_vae" and self.temporal not in (None, 1):
            raise ValueError("image VAEs have temporal compression 1")
        if self.normalisation is not None:
            t = self.normalisation.get("type")
            if t not in ("scale_shift", "mean_std"):
                raise ValueError(f"unknown normalisation type {t!r}")
            if t == "mean_std" and self.latent_channels is not None:
                # an audio VAE normalises its patchified channels: latent_channels x frequency_bins
                want = self.latent_channels * (self.frequency_bins if self.kind == "audio_vae" else 1)
                for key in ("mean", "std"):
                    if len(self.normalisation[key]) != want:
                        raise ValueError(
                            f"normalisation {key} has {len(self.normalisation[key])} entries, "
                            f"expected {want} (latent_channels={self.latent_channels}"
                            + (f" x frequency_bins={self.frequency_bins})" if self.kind == "audio_vae" else ")")
                        )
        if self.padding_side not in (None, "left", "right"):
            raise ValueError(f"padding_side must be 'left' or 'right', got {self.padding_side!r}")

    @property
    def stored_channels(self) -> int | None:
        """Channels of what ``encode`` returns (2C for ``store="mean_std"``)."""
        if self.latent_channels is None:
            return None
        return 2 * self.latent_channels if self.store == "mean_std" else self.latent_channels

    def latent_shape(self, shape: Iterable[int]) -> tuple[int, ...]:
        """Latent shape (without batch) for a pixel shape ``(C,H,W)`` or ``(C,F,H,W)``.

        Pure arithmetic; raises ``ValueError`` for sizes the VAE cannot represent.
        """
        shape = tuple(int(s) for s in shape)
        if self.kind == "text":
            raise ValueError("latent_shape is for VAEs")
        check_pixel_shape(self, shape)
        c = self.stored_channels
        if len(shape) == 3:
            _, h, w = shape
            return (c, h // self.spatial, w // self.spatial)
        _, f, h, w = shape
        return (c, 1 + (f - 1) // self.temporal, h // self.spatial, w // self.spatial)

    def to_dict(self) -> dict:
        d = asdict(self)
        text = ("max_length", "dim", "padding_side", "pooled_dim", "zero_padding", "hidden_states", "audio_dim",
                "features", "quantize")
        audio = ("sample_rate", "hop_length", "n_fft", "mel_bins", "frequency_bins")
        if self.kind == "text":
            drop = ("latent_channels", "spatial", "temporal", "normalisation", "store") + audio
            if self.audio_dim is None and self.features is None:  # (older stamps stay equal)
                drop += ("audio_dim", "features")
            if self.quantize is None:
                drop += ("quantize",)
        elif self.kind == "audio_vae":
            drop = text + ("spatial",)
        else:
            drop = text + audio
        for k in drop:
            d.pop(k, None)
        return _jsonable(d)


def check_pixel_shape(spec: EncoderSpec, shape: tuple[int, ...]) -> None:
    """Raise a clear ``ValueError`` if a pixel tensor shape (without batch) is not encodable."""
    if spec.kind == "image_vae":
        if len(shape) != 3:
            raise ValueError(
                f"{spec.family} is an image VAE: expected [B,3,H,W] pixels, got per-item shape {shape}"
            )
        _, h, w = shape
    else:
        if len(shape) != 4:
            raise ValueError(
                f"{spec.family} is a video VAE: expected [B,3,F,H,W] pixels, got per-item shape {shape}"
            )
        _, f, h, w = shape
        t = spec.temporal or 1
        if f < 1 or (f - 1) % t != 0:
            lo = 1 + ((max(f, 1) - 1) // t) * t
            raise ValueError(
                f"{spec.family} VAE has {t}x temporal compression: frame count must be 1 + {t}k "
                f"(F = 1, {1 + t}, {1 + 2 * t}, ...), got F={f}; crop to F={lo} or pad to F={lo + t}"
            )
    if shape[0] != 3:
        raise ValueError(f"expected 3 pixel channels, got {shape[0]}")
    s = spec.spatial or 1
    if h % s or w % s:
        raise ValueError(
            f"{spec.family} VAE has {s}x spatial compression: height and width must be multiples "
            f"of {s}, got {h}x{w}"
        )


@dataclass
class Provenance:
    """Where an encoder's weights came from.

    ``weights`` is ``"pretrained"`` (loaded with ``from_pretrained``) or
    ``"random-weights"`` (built from a config, seeded). Random-weight outputs are never
    model-space data; the manifest must show it.
    """

    cls: str
    weights: str
    path_or_repo: str | None = None
    subfolder: str | None = None
    revision: str | None = None
    weights_sha256: str | None = None
    config: dict = field(default_factory=dict)
    config_name: str | None = None  # "tiny" / "published" / "custom" for random weights
    seed: int | None = None
    tokenizer: str | None = None
    weight_files: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.weights not in ("pretrained", "random-weights"):
            raise ValueError(f"Provenance.weights must be 'pretrained' or 'random-weights', got {self.weights!r}")

    @property
    def is_random(self) -> bool:
        return self.weights == "random-weights"

    def to_dict(self) -> dict:
        d = asdict(self)
        if d["tokenizer"] is None:
            d.pop("tokenizer")
        return _jsonable(d)


WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt")


def find_weight_files(folder: str | Path) -> list[Path]:
    """Weight files that ``from_pretrained`` would read from a model folder.

    safetensors files win over pickled ones when both exist (diffusers / transformers
    prefer safetensors). Sorted by name.
    """
    folder = Path(folder)
    if not folder.is_dir():
        return []
    files = sorted(p for p in folder.iterdir() if p.is_file() and p.suffix in WEIGHT_SUFFIXES)
    st = [p for p in files if p.suffix == ".safetensors"]
    return st or files


_HASHED: dict[tuple, str] = {}  # sha256_files' answers in this process, by the files' paths, sizes and change times


def sha256_files(files: Iterable[str | Path], chunk: int = 1 << 20) -> str:
    """sha256 over the concatenated bytes of ``files`` in sorted-name order. Files already hashed by this process,
    unchanged since (path, inode, size and modification time alike), are not read again (a build looks its weights'
    hash up for its compiled packages, then loads the model, whose provenance holds it)."""
    paths = sorted((Path(f) for f in files), key=lambda p: p.name)
    stats = [os.stat(p) for p in paths]
    key = tuple((str(p.resolve()), st.st_ino, st.st_size, st.st_mtime_ns) for p, st in zip(paths, stats))
    if key not in _HASHED:
        _HASHED[key] = _sha256_bytes(paths, chunk)
    return _HASHED[key]


def _sha256_bytes(paths: list[Path], chunk: int) -> str:
    h = hashlib.sha256()
    for p in paths:
        with open(p, "rb") as fh:
            while True:
                b = fh.read(chunk)
                if not b:
                    break
                h.update(b)
    return h.hexdigest()


def resolve_model_folder(
    path_or_repo: str, subfolder: str | None = None, revision: str | None = None,
    cache_dir: str | Path | None = None,
) -> tuple[Path | None, str | None, str | None]:
    """Find the local folder holding a pretrained model's files.

    Returns ``(folder, resolved_revision, note)``. A local directory is used as is; a hub
    repo id is looked up in the Hugging Face cache only (``local_files_only=True``: no
    network). ``folder`` is None (with a note) when it cannot be found.
    """
    p = Path(path_or_repo)
    if p.exists():
        folder = p / subfolder if subfolder else p
        return (folder if folder.is_dir() else None), revision, (
            None if folder.is_dir() else f"subfolder {subfolder!r} not found under {p}"
        )
    try:
        from huggingface_hub import snapshot_download

        snap = Path(snapshot_download(
            path_or_repo, revision=revision, local_files_only=True,
            cache_dir=None if cache_dir is None else str(cache_dir),
        ))
    except Exception as e:  # noqa: BLE001 - any failure just means "cannot hash"
        return None, revision, f"could not locate {path_or_repo!r} in the HF cache to hash weights: {type(e).__name__}: {e}"
    folder = snap / subfolder if subfolder else snap
    return (folder if folder.is_dir() else None), (revision or snap.name), (
        None if folder.is_dir() else f"subfolder {subfolder!r} not in cached snapshot {snap}"
    )


def hash_pretrained(
    path_or_repo: str, subfolder: str | None = None, revision: str | None = None,
    cache_dir: str | Path | None = None,
) -> tuple[str | None, list[str], str | None, list[str]]:
    """``(weights_sha256, weight_file_names, resolved_revision, notes)`` for a pretrained model."""
    notes: list[str] = []
    folder, resolved, note = resolve_model_folder(path_or_repo, subfolder, revision, cache_dir)
    if note:
        notes.append(note)
    if folder is None:
        return None, [], resolved, notes
    files = find_weight_files(folder)
    if not files:
        notes.append(f"no weight files found in {folder}; weights_sha256 is None")
        return None, [], resolved, notes
    return sha256_files(files), [f.name for f in files], resolved, notes


def pretrained_kwargs(dtype_key: str, dtype: Any, subfolder: str | None, revision: str | None,
                      cache_dir: str | Path | None) -> dict[str, Any]:
    """Keyword arguments for ``from_pretrained`` (diffusers wants ``torch_dtype``, transformers ``dtype``)."""
    kw: dict[str, Any] = {dtype_key: dtype}
    if subfolder:
        kw["subfolder"] = subfolder
    if revision:
        kw["revision"] = revision
    if cache_dir:
        kw["cache_dir"] = str(cache_dir)
    return kw
