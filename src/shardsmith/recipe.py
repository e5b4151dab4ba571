"""The recipe: a validated description of a whole build (sources, split, images, outputs).

``load_recipe(path)`` reads YAML; ``recipe_from_dict`` validates a dict; both raise
:class:`RecipeError` whose message names each bad key path and the fix. Relative source
paths resolve against the recipe file's folder (or the working directory for CLI builds).
``fingerprint(recipe)`` hashes everything that changes the output (not ``workers``).
"""

from __future__ import annotations

import difflib
import hashlib
import json
import math
import os
import re
import types
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import yaml
from pydantic import (AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, field_validator,
                      model_validator)
from pydantic_core import PydanticCustomError

from shardsmith.errors import UserError
from shardsmith.records import PARTNER_ROLES
from shardsmith.transform.buckets import parse_buckets
from shardsmith.user_paths import check_no_loop, resolve_user_path


class RecipeError(UserError, ValueError):
    """A recipe that cannot be built; the message names the key path and the fix."""


def _takes_number(ann: Any) -> bool:
    """Whether a field's annotation takes an int or float and not a bool (``int``, ``float | None``,
    ``int | tuple[int, int]``, ``Annotated[int, ...] | Literal["all"]``)."""
    while get_origin(ann) is Annotated:
        ann = get_args(ann)[0]
    if get_origin(ann) in (Union, types.UnionType):
        members = get_args(ann)
        return bool not in members and any(_takes_number(m) for m in members)
    return ann in (int, float)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _no_bool_numbers(cls, data: Any) -> Any:
        """A YAML boolean (true/false, yes/no, on/off) where a number goes is refused: pydantic would read it as
        1 / 0 (``split.holdout: true`` was a holdout of one item). Error type ``bool_number``, whose ``key``
        :func:`_error_line` puts in the key path."""
        if isinstance(data, dict):
            for key, value in data.items():
                field = cls.model_fields.get(key) if isinstance(value, bool) else None
                if field is not None and _takes_number(field.annotation):
                    raise PydanticCustomError(
                        "bool_number", "{value} is a yes/no value, not a number (YAML reads true/false, yes/no and "
                        "on/off as booleans); give a number", {"key": key, "value": str(value).lower()})
        return data


def _on_off(value: Any) -> Any:
    """YAML 1.1 reads a bare on/off/yes/no as a boolean: True means "on", False "off"."""
    if isinstance(value, bool):
        return "on" if value else "off"
    return value


def _off(value: Any) -> Any:
    """A bare YAML ``off`` / ``no`` (read as False) means "off"."""
    return "off" if value is False else value


OnOffAuto = Annotated[Literal["auto", "on", "off"], BeforeValidator(_on_off)]


def parse_percent(text: str) -> float:
    """``"10%"`` -> 0.1 (exactly ``float("0.1")``); a ValueError saying how to write it otherwise."""
    number = text.strip().removesuffix("%").strip()
    try:
        value = Decimal(number) / 100
    except InvalidOperation:
        raise ValueError(f"{text!r} is not a percentage; write e.g. 10% (or the fraction 0.1)") from None
    if not value.is_finite() or not 0 <= value < 1:
        raise ValueError(f"{text!r}: a percentage must be at least 0% and below 100%")
    return float(value)


class Columns(_Strict):
    """Column roles of a metadata table; other columns are kept as per-sample metadata.

    Each media role (``target``, ``source``, ``reference``, ``mask``, ``audio``, ``camera``)
    names the column holding that role's file path; ``media`` is a synonym of ``target`` (give
    one of them). A column plays at most one role.
    """

    media: str | None = Field(None, description="column holding the media path, the target "
                              "(auto: media/file/path/image/file_name); a synonym of target")
    target: str | None = Field(None, description="column holding the target media path (same as media)")
    source: str | None = Field(None, description="column holding the paired source media (e.g. an edit's input)")
    reference: str | None = Field(None, description="column holding a reference image or clip")
    mask: str | None = Field(None, description="column holding a mask aligned with the target")
    audio: str | None = Field(None, description="column holding an audio track")
    camera: str | None = Field(None, description="column holding a camera-data file")
    caption: str | None = Field(None, description="caption column (auto: caption/text/prompt)")
    label: str | None = Field(None, description="class label column (int ids or names)")

    @model_validator(mode="after")
    def _one_role_each(self) -> Columns:
        if self.media is not None and self.target is not None:
            raise ValueError(f"both columns.media ({self.media!r}) and columns.target ({self.target!r}) are set; "
                             "they name the same role (the target media): keep one")
        seen: dict[str, str] = {}
        for role in ("target", "media", *PARTNER_ROLES, "caption", "label"):
            col = getattr(self, role)
            if col is None:
                continue
            if col in seen:
                raise ValueError(f"column {col!r} is given to both columns.{seen[col]} and columns.{role}; "
                                 "a column plays one role")
            seen[col] = role
        return self

    @property
    def target_column(self) -> str | None:
        """The target's column as given (``target`` or its synonym ``media``), None to detect it."""
        return self.target if self.target is not None else self.media

    def partners(self) -> dict[str, str]:
        """role -> column of every partner role given (not the target), in role order."""
        return {r: getattr(self, r) for r in PARTNER_ROLES if getattr(self, r) is not None}


class SourceSpec(_Strict):
    path: str
    name: str | None = None
    kind: Literal["auto", "folder", "table", "wds"] = Field(
        "auto", description="auto: a table file, a folder of NNNNN.tar shards (wds: its samples' prompts, for "
        "shardsmith distill) or a folder of media")
    origin: str | None = None
    license: str | None = None
    columns: Columns = Field(default_factory=Columns)
    labels: Literal["auto", "none"] = "auto"
    captions: Literal["sidecar", "none"] = "sidecar"
    caption_errors: Literal["fail", "replace"] = "fail"
    allow_outside_paths: bool = False
    follow_symlinks: bool = Field(False, description="read links whose target lies outside the source folder")

    @field_validator("path")
    @classmethod
    def _not_empty(cls, v: str) -> str:
        if not v.strip():  # "" would read the recipe's own folder
            raise ValueError("the source path is empty; give the folder, table or shard folder to read")
        return v

    @field_validator("name")
    @classmethod
    def _one_folder_name(cls, v: str | None) -> str | None:
        """A name is a folder of the outputs it feeds with other sources (``.precomputed/<name>/...``) and the
        prefix of its item ids: one plain path component, so no two sources' files can land in one place."""
        if v is not None and (not v.strip() or v in (".", "..") or "/" in v or "\0" in v):
            raise ValueError(f"the source name {v!r} is not a plain folder name: it names the folder this source's "
                             "files take in outputs fed by several sources, so it cannot be empty, '.' or '..', nor "
                             "contain '/'; give a name such as 'clips' (or leave name out: the path's last name)")
        return v


class SplitSpec(_Strict):
    holdout: float = Field(0, ge=0, description="fraction in [0,1), a percentage such as 10%, or a whole count >= 1")
    seed: int = 0
    dedup: bool = True

    @field_validator("holdout", mode="before")
    @classmethod
    def _percent(cls, v: Any) -> Any:
        return parse_percent(v) if isinstance(v, str) and v.strip().endswith("%") else v

    @field_validator("holdout")
    @classmethod
    def _holdout(cls, v: float) -> float:
        if not math.isfinite(v):  # inf (nan is caught by ge=0): no count, and int(inf) would be an OverflowError
            raise ValueError(f"holdout {v} is infinite: neither a fraction nor a count of items")
        if v >= 1 and v != int(v):
            raise ValueError("holdout >= 1 is a count and must be a whole number (or give a fraction < 1)")
        return v


class ImageRules(_Strict):
    """How every image is decoded and screened, whatever the output."""

    max_pixels: int = Field(89_478_485, gt=0, description="decompression-bomb limit (pixels)")
    background: tuple[int, int, int] = (255, 255, 255)
    min_size: int = Field(0, ge=0, description="images whose shorter side is below this are skipped:too_small")
    upscale: bool = False
    decoder: Literal["auto", "cpu", "cpu-draft", "gpu"] = Field(
        "auto", description="how latent outputs decode JPEGs: cpu (Pillow, full size), cpu-draft (Pillow at the "
        "smallest DCT scale that covers the resize: a fraction of the work for large photos), gpu (nvJPEG through "
        "torchvision on the encoders' device), or auto (cpu off a GPU; on one cpu-draft, or gpu when fewer than 4 "
        "decode workers); the pixels of cpu-draft and gpu differ slightly from cpu's (README). A build keeps the "
        "choice it began with")

    @field_validator("background")
    @classmethod
    def _bg(cls, v: tuple[int, int, int]) -> tuple[int, int, int]:
        if any(not 0 <= c <= 255 for c in v):
            raise ValueError("background must be three integers in 0..255, e.g. [255, 255, 255]")
        return v


class ImageEncoding(_Strict):
    format: Literal["jpg", "png", "webp"] = "jpg"
    quality: int = Field(95, ge=1, le=100)
    max_side: int | None = Field(None, gt=0)
    passthrough: bool = False
    size: int | None = Field(None, gt=0, description="img2dataset's image_size: resize every image to this size "
                             "by resize_mode (not with max_side)")
    resize_mode: Literal["center_crop", "border", "keep_ratio"] = Field(
        "center_crop", description="with size: center_crop (shorter side to size, then a centred size x size crop), "
        "border (longer side to size, padded to size x size with images.background), keep_ratio (shorter side "
        "to size, no crop)")
    max_aspect: float | None = Field(None, ge=1, description="skip images whose longer/shorter side ratio is above "
                                     "this (skipped:aspect_ratio), as img2dataset's max_aspect_ratio")

    @model_validator(mode="after")
    def _one_size(self) -> "ImageEncoding":
        if self.size is not None and self.max_side is not None:
            raise ValueError(f"max_side ({self.max_side}) and size ({self.size}) are both set; keep one: size with "
                             "resize_mode for a fixed size, max_side to bound the longer side")
        return self


def _own_folder(value: str) -> str:
    """An output's ``dir`` names a folder inside ``--out``, not ``--out`` itself (``.``, ``./``, empty, ``a/..``)."""
    if os.path.normpath(value) == ".":
        raise ValueError(f"{value!r} is the build folder (--out) itself, which also holds the build's manifest.json, "
                         ".shardsmith/ (the ledger), holdout/ and the other outputs' folders: this output's files "
                         "would lie among them; give it a folder of its own such as dir: shards, or leave dir out "
                         "for its format's own folder")
    return value


OutputDir = Annotated[str, AfterValidator(_own_folder)]  # the ``dir`` of a folder output (wds, latent_wds, ...)


class WdsOutput(_Strict):
    format: Literal["wds"]
    name: str | None = None
    dir: OutputDir = "wds"
    samples_per_shard: int = Field(1000, gt=0)
    max_shard_bytes: int | None = Field(None, gt=0)
    image: ImageEncoding = Field(default_factory=ImageEncoding)
    sources: list[str] | None = None
    metadata: bool = True


class _EdmZipOutput(_Strict):
    """What both EDM ZIP outputs share: the ZIP's path, the pixel geometry of EDM's ``dataset_tool``
    transforms, and resumable units."""

    name: str | None = None
    path: str
    resolution: int | tuple[int, int]
    transform: Literal["center-crop", "center-crop-wide", "center-crop-dhariwal"] = "center-crop"
    upscale: bool | None = Field(None, description="enlarge images smaller than the resolution (default: images.upscale)")
    unit: int = Field(1000, gt=0, description="images per resumable unit of work (staged, then assembled)")
    sources: list[str] | None = None

    @property
    def size(self) -> tuple[int, int]:
        r = self.resolution
        return (r, r) if isinstance(r, int) else (int(r[0]), int(r[1]))

    @model_validator(mode="after")
    def _shape(self) -> "_EdmZipOutput":
        w, h = self.size
        if w <= 0 or h <= 0:
            raise ValueError("resolution must be positive, e.g. 64 or [64, 64]")
        if self.transform == "center-crop-wide":
            if h > w:
                raise ValueError("center-crop-wide needs resolution [W, H] with H <= W (output is W x W)")
        elif w != h:
            raise ValueError(f"{self.transform} writes square images: give resolution: {w} (not [{w}, {h}])")
        if not self.path.endswith(".zip"):
            raise ValueError(f"path must end in .zip, got {self.path!r}")
        return self


class ZipOutput(_EdmZipOutput):
    format: Literal["zip"]
    path: str = "dataset.zip"


class LatentWdsOutput(_Strict):
    """WebDataset shards of cached latents (``latent.pth``) and text embeddings (``txt_emb.pth``)."""

    format: Literal["latent_wds"]
    name: str | None = None
    dir: OutputDir = "latents"
    samples_per_shard: int = Field(1000, gt=0)
    max_shard_bytes: int | None = Field(None, gt=0, description="close a shard before it would pass this size "
                                        "(a float32 T5-XXL embedding alone is 8 MiB); exact, so the same "
                                        "samples close a shard on every run")
    include_media: bool = Field(False, description="also store the source media bytes (jpg/png/mp4 ...)")
    negative_prompt: str = Field("", description="encoded once into neg_prompt_emb.npy beside the shards")
    latent_dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    text_dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    sources: list[str] | None = None


class PrecomputedOutput(_Strict):
    """The LTX-trainer ``.precomputed/`` tree: ``latents/`` and ``conditions/`` ``.pt`` dicts."""

    format: Literal["precomputed"]
    name: str | None = None
    dir: OutputDir = ".precomputed"
    unit: int = Field(64, gt=0, description="items per resumable unit of work")
    latent_dtype: Literal["float32", "bfloat16", "float16"] = "bfloat16"
    text_dtype: Literal["float32", "bfloat16", "float16"] = "bfloat16"
    sources: list[str] | None = None


class LatentZipOutput(_EdmZipOutput):
    """The EDM2 / FastGen latent ZIP (``imagenet_256_sd.zip``): one float32 ``.npy`` per image, the
    posterior mean then std of ``models.vae`` (``store: mean_std``), ``[2C, side/f, side/f]``, and
    ``dataset.json`` labels. Its geometry is ``resolution`` and ``transform`` (not ``geometry.buckets``)."""

    format: Literal["latent_zip"]
    path: str = "latents.zip"
    resolution: int | tuple[int, int] = Field(description="square side in pixels before the VAE (a multiple of "
                                              "its spatial factor); [W, H] for center-crop-wide (W x W pixels)")
    transform: Literal["center-crop", "center-crop-wide", "center-crop-dhariwal"] = "center-crop-dhariwal"

    @property
    def side(self) -> int:
        """The square pixel side the VAE encodes."""
        return self.size[0]


class VideoWdsOutput(_Strict):
    """WebDataset shards of raw clips as FastGen's ``VideoLoaderConfig`` reads them: ``mp4``,
    ``txt`` (the caption) and ``json`` per sample. Each clip is cut to its bucket of
    ``geometry.buckets`` (those with F > 1) at ``geometry.fps``; a clip that already is an H.264
    mp4 of exactly that size, frame count and fps is passed through byte-identical (with
    ``passthrough``), any other is re-encoded with ``codec`` / ``crf`` / ``preset`` (audio dropped)."""

    format: Literal["video_wds"]
    name: str | None = None
    dir: OutputDir = "videos"
    samples_per_shard: int = Field(100, gt=0)
    max_shard_bytes: int | None = Field(None, gt=0, description="close a shard before it would pass this size; "
                                        "exact, so the same samples close a shard on every run")
    passthrough: bool = Field(True, description="keep a clip's bytes when its codec, size, frames and fps "
                              "already match its bucket")
    codec: Literal["h264"] = Field("h264", description="the codec of re-encoded clips (libx264, yuv420p)")
    crf: int = Field(18, ge=0, le=51, description="x264 constant rate factor of re-encoded clips (lower: better)")
    preset: Literal["ultrafast", "superfast", "veryfast", "faster", "fast", "medium", "slow", "slower",
                    "veryslow"] = Field("medium", description="x264 speed / size trade-off of re-encoded clips")
    require_caption: bool = Field(True, description="skip clips without a caption (skipped:no_caption): video "
                                  "loaders read txt as the condition; false writes an empty txt instead")
    audio: Literal["none", "wav", "flac"] = Field(
        "none", description="also write each clip's audio, cut to the written frames at the source's sample rate "
        "(stereo, 16-bit), as a wav or flac member; a clip without audio gets none, one whose audio does not "
        "decode is failed:audio_decode_error")
    sources: list[str] | None = None


class PromptWdsOutput(_Strict):
    """Prompt-only WebDataset shards (prompt-only distillation): ``txt`` per sample and, when
    ``models.text`` is set, its embedding ``txt_emb.pth`` ``[L, D]`` with ``neg_prompt_emb.npy``
    beside the shards. Needs no ``models.vae`` and no ``geometry.buckets``."""

    format: Literal["prompt_wds"]
    name: str | None = None
    dir: OutputDir = "prompts"
    samples_per_shard: int = Field(1000, gt=0)
    max_shard_bytes: int | None = Field(None, gt=0, description="close a shard before it would pass this size "
                                        "(a float32 T5-XXL embedding alone is 8 MiB); exact, so the same "
                                        "samples close a shard on every run")
    negative_prompt: str = Field("", description="encoded once into neg_prompt_emb.npy beside the shards "
                                 "(needs models.text)")
    text_dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    metadata: bool = Field(True, description="write the per-sample json member")
    sources: list[str] | None = None


class KdWdsOutput(_Strict):
    """Knowledge-distillation shards (``shardsmith distill``): per prompt of the train split, the
    teacher's ``noise.pth``, final sample ``latent.pth``, ``txt_emb.pth`` and (``path: true``) its
    trajectory ``path.pth``; ``index.json`` and ``shard_count.json`` beside the shards."""

    format: Literal["kd_wds"]
    name: str | None = None
    dir: OutputDir = "kd"
    samples_per_shard: int = Field(100, gt=0)
    path: bool = Field(True, description="also write path.pth: the teacher's states at the non-terminal entries "
                       "of distill.t_list (FastGen's PathLoaderConfig); false: pairs only (PairLoaderConfig)")
    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        "float32", description="dtype of noise.pth, latent.pth and path.pth (the solver runs in float32)")
    text_dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    metadata: bool = Field(True, description="write the per-sample json member (prompt id, seed)")
    sources: list[str] | None = None


Output = Annotated[Union[WdsOutput, ZipOutput, LatentWdsOutput, PrecomputedOutput, LatentZipOutput, VideoWdsOutput, PromptWdsOutput, KdWdsOutput], Field(discriminator="format")]
LATENT_OUTPUTS = (LatentWdsOutput, PrecomputedOutput, LatentZipOutput)  # the outputs models.vae encodes
BUCKETED_OUTPUTS = (LatentWdsOutput, PrecomputedOutput)  # latent outputs cut to geometry.buckets
AUDIO_OUTPUTS = (LatentWdsOutput, PrecomputedOutput)  # the outputs models.audio_vae writes audio latents into


class VaeModel(_Strict):
    family: Literal["sd", "sdxl", "flux", "wan", "ltx", "ltx2"]
    pretrained: str | None = Field(None, description="local path or hub repo id; unset = random weights")
    subfolder: str | None = None
    revision: str | None = None
    config: str | dict[str, Any] = Field("tiny", description="architecture when pretrained is unset")
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    store: Literal["mean", "mean_std", "sample"] = "mean"


MAX_TEXT_LENGTH = 65536  # tokens: models.text.max_length's cap, whatever the encoder (see TextModel.max_length)


class TextModel(_Strict):
    family: Literal["minilm", "t5", "umt5", "clip", "gemma", "ltx2"] = Field(
        "minilm", description="ltx2: Gemma 3 hidden states through LTX-2's feature extractor, the conditions the "
        "LTX-2 trainer caches (video_prompt_embeds and audio_prompt_embeds)")
    pretrained: str | None = None
    config: str | dict[str, Any] = "tiny"
    max_length: int | None = Field(
        None, gt=0, description=f"tokens every prompt is padded / cut to (default: the family's, 77 minilm and "
        f"clip, 512 t5 and umt5, 1024 gemma and ltx2); at most the encoder's positions (its config's "
        f"max_position_embeddings: 77 for CLIP, 512 for MiniLM; checked before the plan) and never above "
        f"{MAX_TEXT_LENGTH} (a sanity cap, 64 x the 1024 LTX-2 pads to: every prompt's embedding is max_length x "
        f"width, so a larger value only fills memory)")
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    quantize: Literal["none", "int8", "fp8"] = Field(
        "none", description="int8 / fp8 weights for small GPUs (LTX's --load-text-encoder-in-8bit: int8); "
        "another cache than full precision (pip install shardsmith[quant])")

    @field_validator("max_length")
    @classmethod
    def _max_length(cls, v: int | None) -> int | None:
        if v is not None and v > MAX_TEXT_LENGTH:
            raise ValueError(f"{v} tokens is above shardsmith's cap of {MAX_TEXT_LENGTH} tokens (every prompt is "
                             "padded to max_length: a build at such a length runs out of memory)")
        return v


class AudioVaeModel(_Strict):
    """The audio encoder of ``audio_latents/`` (LTX-2's audio VAE, diffusers ``AutoencoderKLLTX2Audio``)."""

    family: Literal["ltx2_audio"] = "ltx2_audio"
    pretrained: str | None = Field(None, description="local path or hub repo id; unset = random weights")
    subfolder: str | None = None
    revision: str | None = None
    config: str | dict[str, Any] = Field("tiny", description="architecture when pretrained is unset: tiny, "
                                         "published, or a dict of the model's config")
    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        "float32", description="the encoder's dtype (the LTX trainer runs it in float32; latents are stored float32)")


class TeacherModel(_Strict):
    """The teacher of ``shardsmith distill``: a diffusers denoiser (``family: sana``, a flow-matching
    text-to-image DiT; ``family: unet``, a Stable-Diffusion-style UNet, epsilon or v prediction, sampled
    as EDM's denoiser; ``from_pretrained`` or a published config with random weights) or a Python
    callable named by ``entry_point`` (``family: callable``): ``velocity(x, t, cond)`` for
    ``parameterisation: flow``, ``denoise(x, sigma, cond)`` for ``edm``."""

    family: Literal["callable", "sana", "unet"]
    entry_point: str | None = Field(None, description="family callable: 'package.module:function'")
    parameterisation: Literal["flow", "edm"] | None = Field(
        None, description="flow (rectified flow: the model gives the velocity) or edm (the model gives the denoised "
        "sample at noise level sigma); sana is flow, unet edm")
    pretrained: str | None = Field(None, description="local path or hub repo id; unset = random weights")
    subfolder: str | None = None
    revision: str | None = None
    config: str | dict[str, Any] = Field("tiny", description="architecture when pretrained is unset: tiny, "
                                         "published, or a dict of the model's config")
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"

    @model_validator(mode="after")
    def _kind(self) -> "TeacherModel":
        if self.family == "callable":
            if not self.entry_point or ":" not in self.entry_point:
                raise ValueError("models.teacher.family callable needs entry_point: 'package.module:function' "
                                 "(e.g. shardsmith.distill.gaussian:velocity)")
            if self.parameterisation is None:
                raise ValueError("models.teacher.family callable needs parameterisation: flow (the callable is "
                                 "velocity(x, t, cond)) or edm (denoise(x, sigma, cond))")
        else:
            if self.entry_point is not None:
                raise ValueError(f"models.teacher.entry_point is for family callable, not {self.family}")
            own = "flow" if self.family == "sana" else "edm"
            if self.parameterisation not in (None, own):
                raise ValueError(f"models.teacher.family {self.family} is sampled as {own}: parameterisation is "
                                 f"{own} (or leave it out)")
            self.parameterisation = own
        return self


class Models(_Strict):
    vae: VaeModel | None = None
    text: TextModel | None = None
    audio_vae: AudioVaeModel | None = Field(None, description="encode each clip's (or audio file's) audio into "
                                            "audio_latents/ (precomputed) or audio_latent.pth (latent_wds)")
    teacher: TeacherModel | None = Field(None, description="the teacher whose trajectories a kd_wds output "
                                         "writes (shardsmith distill)")
    batch_size: int | None = Field(None, gt=0, description="encode batch (default: automatic)")
    compile: OnOffAuto = Field(
        "auto", description="torch.compile the VAE encoder (cached between runs): 'auto' decides before the first "
        "batch, on a GPU, whether the planned items repay the compile time; a resume follows the build's decision "
        "(not part of the fingerprint)")
    device: Annotated[str, Field(pattern=r"^(auto|cuda|cpu|cuda:\d+)$")] = Field(
        "auto", description="where the models run: 'auto' is the GPU when torch sees one, else the CPU; 'cuda' "
        "refuses to start without one; 'cuda:N' is visible GPU N (not part of the fingerprint)")
    offload: Annotated[Literal["auto", "off", "text-first"], BeforeValidator(_off)] = Field(
        "auto", description="text-first: every caption encoded first into a cache under .shardsmith/, the text "
        "encoder freed, then the VAE loaded (for GPUs that cannot hold both); auto: text-first when the memory "
        "plan says the two do not fit together but each fits alone, else off (not part of the fingerprint: the "
        "bytes are the same)")


def _durations(value: Any) -> Any:
    """``"2.0;4.0;8.0"`` (LTX's --audio-durations) -> ``[2.0, 4.0, 8.0]``; a list as given."""
    if isinstance(value, str):
        return [part.strip() for part in value.split(";") if part.strip()]
    return value


class AudioRules(_Strict):
    """What happens to audio: required or not, skipped, and the duration buckets of audio-only items."""

    required: bool | None = Field(None, description="fail the run (exit 3) when no item decoded audio; each item "
                                  "without audio is failed:no_audio_stream / failed:audio_decode_error (default: "
                                  "true whenever models.audio_vae is set)")
    skip: bool = Field(False, description="turn audio off (LTX's --skip-audio): no audio latents, said in the manifest")
    durations: Annotated[list[float] | None, BeforeValidator(_durations)] = Field(
        None, description="duration buckets in seconds of audio-only items (LTX's --audio-durations '2.0;4.0;8.0'): "
        "each file takes the largest bucket not longer than it; shorter files are skipped:too_short")
    resampler: Literal["sinc", "ffmpeg"] = Field(
        "sinc", description="how audio reaches the encoder's rate. sinc: LTX-2's way, the window cut at the "
        "source's rate, then torchaudio's resample (Hann-windowed sinc, 6 zero crossings, rolloff 0.99) on the "
        "audio encoder's device before the mel; ffmpeg: FFmpeg's swresample in the decode workers, then the cut "
        "at the encoder's rate (what builds did before this setting; a resumed build keeps the one it began with)")

    @field_validator("durations")
    @classmethod
    def _positive(cls, v: list[float] | None) -> list[float] | None:
        if v is None:
            return v
        if not v:
            raise ValueError("durations is empty; give seconds such as [2.0, 4.0, 8.0] or leave it out")
        bad = [d for d in v if not (d > 0 and math.isfinite(d))]
        if bad:
            raise ValueError(f"audio.durations: every duration must be > 0 seconds and finite, got {bad[0]}; "
                             "give seconds such as [2.0, 4.0, 8.0]")
        if len(set(v)) != len(v):
            raise ValueError(f"durations {v} repeat a value; give each bucket once")
        return sorted(v)

    @model_validator(mode="after")
    def _skip_or_require(self) -> "AudioRules":
        if self.skip and self.required:
            raise ValueError("audio.skip and audio.required are both true; keep one (skip turns audio off)")
        return self


class Geometry(_Strict):
    """Buckets ``WxHxF`` (F=1 for images) and optional frame-rate resampling for video."""

    buckets: list[str] = Field(default_factory=list)
    fps: float | None = Field(None, gt=0, description="resample video to this frame rate (default: native)")
    reference_downscale_factor: int = Field(
        1, ge=1, description="IC-LoRA references at the target's bucket divided by this on each side (LTX's "
        "--reference-downscale-factor); W/k and H/k must stay multiples of the VAE's spatial factor")
    reference_temporal_scale_factor: int = Field(
        1, ge=1, description="IC-LoRA references keep the target's first frame, then every k-th of the rest "
        "(frames 0, 1, 1+k, ...; LTX's --reference-temporal-scale-factor) at fps / k; the count must keep the "
        "VAE's 1 + temporal*n rule")

    @field_validator("fps")
    @classmethod
    def _fps(cls, v: float | None) -> float | None:
        if v is not None and not math.isfinite(v):
            raise ValueError(f"geometry.fps {v} is not a finite frame rate; give frames per second such as 24 "
                             "(or leave it out for the native rate)")
        return v

    @field_validator("buckets")
    @classmethod
    def _parse(cls, v: list[str]) -> list[str]:
        if v:
            parse_buckets(v)  # 'WxHxF' each, no repeats (what the VAE can encode is checked in precheck)
        return v


#: what a dataset is for (``mode``) -> the partner roles every item must have (from table columns).
#: The LTX modes of reference/ltx-trainer.md §5, plus image editing and camera-controlled video.
MODE_ROLES: dict[str, tuple[str, ...]] = {
    "t2i": (), "t2v": (), "i2v": (), "v2v-ic": ("reference",), "a2v": (), "v2a": (), "t2a": (),
    "video-inpaint": ("mask",), "audio-inpaint": ("mask",), "av2av-ic": ("reference",), "a2a-ic": ("reference",),
    "image-edit": ("source",), "camera-video": ("camera",)}
#: the modes that encode audio (an output with audio latents, models.audio_vae)
AUDIO_MODES = ("a2v", "v2a", "t2a", "audio-inpaint", "av2av-ic", "a2a-ic")
#: the target media each mode takes (the plan skips an item of another kind as
#: skipped:unsupported_kind_<kind>); t2v takes stills too, as one-frame clips (LTX's F = 1 buckets)
MODE_TARGETS: dict[str, tuple[str, ...]] = {
    "t2i": ("image",), "t2v": ("image", "video"), "i2v": ("video",), "v2v-ic": ("video",), "a2v": ("video",),
    "v2a": ("video",), "t2a": ("audio",), "video-inpaint": ("video",), "audio-inpaint": ("audio",),
    "av2av-ic": ("video",), "a2a-ic": ("audio",), "image-edit": ("image",), "camera-video": ("video",)}


class Distribute(_Strict):
    """Who runs the unit jobs: ``gpus`` worker processes on this machine, each with its own models on
    one GPU and its own decode workers, claiming units; the same bytes as one process (not part of the
    fingerprint: a build may resume with another count)."""

    gpus: Annotated[int, Field(ge=1)] | Literal["all"] = Field(
        1, description="worker processes, one per GPU (cuda:0 .. cuda:N-1; all: every visible GPU)")
    engine: Literal["local", "ray"] = Field("local", description="local: worker processes on this machine; "
                                            "ray: Ray actors, one per GPU, on a Ray cluster (pip install "
                                            "shardsmith[ray])")
    address: str | None = Field(None, description="ray: the cluster (auto, ray://host:10001); unset: a local "
                                "cluster started for the build")


FASTGEN_T_LIST = (0.999, 0.937, 0.833, 0.624, 0.0)  # FastGen's config_kd_path.py sample_t_cfg.t_list


class DistillSpec(_Strict):
    """How the teacher samples (``shardsmith distill``): the ODE from ``t_list[0]`` to 0 with ``steps``
    solver steps, through every entry of ``t_list`` (the states ``path.pth`` keeps)."""

    solver: Literal["euler", "heun"] = "heun"
    steps: int = Field(32, gt=0, description="solver steps from t_list[0] to 0 (shared among t_list's segments)")
    t_list: list[float] = Field(list(FASTGEN_T_LIST), description="times (flow: t in [0, 1]; edm: sigma) of the "
                                "states path.pth keeps (every entry but the last, 0.0: the final sample is latent.pth); "
                                "FastGen's default [0.999, 0.937, 0.833, 0.624, 0.0]")
    rho: float | None = Field(None, gt=0, description="spacing of the solver's steps inside a segment, even in "
                              "t**(1/rho) (default: 1 for flow, 7 for edm, Karras et al.)")
    # (no ge=0 here: NaN, inf, negative and huge scales all get one message, distill.sources.check_guidance's,
    # before anything is planned)
    guidance: float = Field(1.0, description="classifier-free guidance scale (1: the conditional model alone), a "
                            "finite number from 0 to 1000")
    negative_prompt: str = Field("", description="the unconditional prompt of classifier-free guidance")
    shape: list[int] | None = Field(None, description="one sample's latent shape: [C, H, W] or [C, T, H, W]; "
                                    "unset: each sample takes the shape of its latent.pth in a latent_wds source",
                                    min_length=3, max_length=4)
    text: Literal["encode", "source"] = Field(
        "encode", description="encode: models.text embeds each prompt; source: each sample's txt_emb.pth in its "
        "prompt_wds / latent_wds source (and neg_prompt_emb.npy beside it for guidance), no text encoder")
    seed: int = Field(0, description="the seed every sample's own seed is derived from (with its item id)")
    preview: int = Field(0, ge=0, description="before the run, sample the teacher on this many training prompts "
                         "and write their decoded pictures to .shardsmith/preview/ in the build folder (needs "
                         "models.vae)")

    @field_validator("shape")
    @classmethod
    def _shape(cls, v: list[int] | None) -> list[int] | None:
        if v is not None and any(d <= 0 for d in v):
            raise ValueError(f"distill.shape {v}: every size must be positive")
        return v

    @field_validator("t_list")
    @classmethod
    def _t_list(cls, v: list[float]) -> list[float]:
        from shardsmith.distill.schedule import check_t_list

        try:
            check_t_list(v)
        except ValueError as exc:
            raise ValueError(str(exc)) from None  # (pydantic prefixes distill.t_list)
        return v


# names in a build folder that the build writes itself: no output may write there (HOLDOUT_DIR holds every
# output's held-out split, as holdout/<its dir>)
_RESERVED_TARGETS = {"manifest.json": "the build's manifest", "report.html": "the build's HTML report"}
_RESERVED_TOPS = {"holdout": "the held-out split's outputs (holdout/<dir>)", ".shardsmith": "the build's ledger "
                  "and state"}


def _check_target(name: str, target: str) -> str:
    """An output's ``dir``/``path`` normalised (``./wds``, ``wds/`` and ``wds`` are one folder); refuses
    one that is a file or folder the build writes itself, or lies under one (see :data:`_RESERVED_TARGETS`), and
    one that makes a folder named like a dataset's own file (:func:`_dataset_file`: ``shard_count.json``, a
    ``.tar``), which would make the folder holding it look like a dataset."""
    norm = os.path.normpath(target)
    top = Path(norm).parts[0] if norm != "." else "."
    what = _RESERVED_TARGETS.get(top) or _RESERVED_TOPS.get(top)  # (manifest.json/x: a folder where it goes)
    if what is not None:
        raise ValueError(f"output {name!r}: {target!r} is where the build keeps {what}; choose another "
                         "dir/path for this output")
    parts = Path(norm).parts
    for i, part in enumerate(parts[:-1] if norm.endswith(".zip") else parts):  # (a ZIP's file name: its path)
        what = _dataset_file(part)
        if what is not None:
            other = str(Path(*parts[:i], f"{part.rsplit('.', 1)[0]}_data", *parts[i + 1:]))
            raise ValueError(f"output {name!r}: {target!r} makes a folder named {part!r}, the name of {what}: the "
                             "folder holding it would be taken for a dataset (by verify, inspect and the build's "
                             "report, which could then never be written); choose another dir/path for this output, "
                             f"e.g. {other!r}")
    return norm


def _dataset_file(name: str) -> str | None:
    """What ``name`` is the name of in a dataset folder (an index file, the ``.precomputed/`` stamp, a ``.tar``
    shard), or None: a folder of that name makes the folder holding it look like a dataset."""
    from shardsmith.formats.precomputed import PRECOMPUTED_STAMP
    from shardsmith.formats.wds import INDEX_FILES, is_shard_file_name

    if name in INDEX_FILES:
        return "a dataset's index file"
    if name == PRECOMPUTED_STAMP:
        return "a .precomputed/ tree's stamp"
    if is_shard_file_name(name):
        return "a WebDataset shard (.tar)"
    return None


def _refuse_nested(key: str, target: str, norm: str, name: str, targets: dict[str, str],
                   keys: dict[str, tuple[str, str]]) -> None:
    """An output's folder (``dir``) or ZIP (``path``) may not lie inside another output's folder, nor hold one:
    one output's files would lie in the other's dataset, which its readers (the loaders' shard listing, verify,
    inspect, repair, the build's own clean-up of an output's folder) take as theirs. Side by side is fine
    (``dir: wds`` and ``dir: .precomputed``); the held-out split mirrors the same layout under ``holdout/``."""
    parts = Path(norm).parts
    for other, other_name in targets.items():
        theirs = Path(other).parts
        if parts[:len(theirs)] == theirs or theirs[:len(parts)] == parts:
            (outer_key, outer), (inner_key, inner) = ((keys[other], (key, target)) if len(theirs) < len(parts)
                                                      else ((key, target), keys[other]))
            outer_name, inner_name = (other_name, name) if len(theirs) < len(parts) else (name, other_name)
            beside = Path(os.path.normpath(inner)).name
            if beside in targets or beside == norm:
                beside = os.path.normpath(inner).replace("/", "_")
            raise ValueError(f"{inner_key} {inner!r} (output {inner_name!r}) lies inside {outer_key} {outer!r} (output "
                             f"{outer_name!r}): its files would lie in the other output's dataset, whose readers "
                             "(loaders, verify, repair) take everything there as theirs; give it a place beside the "
                             f"other, not inside, e.g. {inner_key}: {beside} instead of {inner}")


class Recipe(_Strict):
    sources: list[SourceSpec] = Field(min_length=1)
    mode: Literal["t2i", "t2v", "i2v", "v2v-ic", "a2v", "v2a", "t2a", "video-inpaint", "audio-inpaint", "av2av-ic",
                  "a2a-ic", "image-edit", "camera-video"] | None = Field(
        None, description="what the dataset is for: the roles every item needs (v2v-ic a reference, image-edit a "
        "source, video-inpaint a mask, camera-video camera data: table columns) and the audio a mode encodes; "
        "recorded in the manifest and the .precomputed/ stamp, and checked by verify")
    split: SplitSpec = Field(default_factory=SplitSpec)
    images: ImageRules = Field(default_factory=ImageRules)
    outputs: list[Output] = Field(min_length=1)
    models: Models = Field(default_factory=Models)
    geometry: Geometry = Field(default_factory=Geometry)
    audio: AudioRules = Field(default_factory=AudioRules)
    one_sample: bool = Field(False, description="plan only the first usable item (sanity check before a full run)")
    distill: DistillSpec | None = Field(None, description="how the teacher samples (shardsmith distill, kd_wds)")
    distribute: Distribute = Field(default_factory=Distribute, description="several GPUs: --gpus N|all")
    lora_trigger: str | None = Field(None, description="prepended to every caption with one space, as the LTX "
                                     "trainer's --lora-trigger (recorded in the manifest and the cache stamp)")

    @field_validator("lora_trigger")
    @classmethod
    def _trigger(cls, v: str | None) -> str | None:
        if v is not None and not v.strip():
            raise ValueError("lora_trigger is empty; give the trigger word (e.g. MYTRIGGER) or leave it out")
        return v
    workers: int | None = Field(None, ge=1, description="CPU worker processes (not part of the fingerprint)")

    def source_ids(self, output) -> list[int]:
        """Indices into ``sources`` of the sources that feed ``output`` (all of them by default)."""
        names = [s.name for s in self.sources]
        return [names.index(n) for n in output.sources] if output.sources else list(range(len(names)))

    def settled(self, section: str, key: str, value: Any) -> "Recipe":
        """This recipe with ``<section>.<key>`` set to ``value`` (a setting a build settles, such as
        ``images.decoder``); itself when it already holds it, else a copy."""
        if getattr(getattr(self, section), key) == value:
            return self
        out = self.model_copy(deep=True)
        setattr(getattr(out, section), key, value)
        return out

    def audio_outputs(self) -> list:
        """The outputs that write audio latents: the precomputed and latent_wds outputs, when
        ``models.audio_vae`` is set and ``audio.skip`` is not."""
        if self.models.audio_vae is None or self.audio.skip:
            return []
        return [o for o in self.outputs if isinstance(o, AUDIO_OUTPUTS)]

    @property
    def audio_required(self) -> bool:
        """Whether a run in which no item decoded audio fails (``audio.required``; by default,
        whenever an output writes audio)."""
        if self.audio.required is not None:
            return self.audio.required
        return bool(self.audio_outputs())

    def audio_encode_seconds(self) -> list[float]:
        """The audio durations (seconds) the audio encoder is known to encode before the plan: each
        ``audio.durations`` bucket, then each clip bucket's ``frames / geometry.fps`` where ``fps`` is set
        (a clip at its native rate gives a length only its probe knows); [] without audio outputs."""
        if not self.audio_outputs():
            return []
        out = list(self.audio.durations or [])
        if self.geometry.fps:
            for b in parse_buckets(self.geometry.buckets):
                if b.frames > 1 and b.frames / self.geometry.fps not in out:
                    out.append(b.frames / self.geometry.fps)
        return out

    def encode_buckets(self) -> list[str]:
        """Every pixel shape ``WxHxF`` the VAE encodes: ``geometry.buckets``, then each ``latent_zip``
        output's square ``SxSx1`` (once each, in that order)."""
        out = list(self.geometry.buckets)
        for o in self.outputs:
            if isinstance(o, LatentZipOutput) and f"{o.side}x{o.side}x1" not in out:
                out.append(f"{o.side}x{o.side}x1")
        return out

    @model_validator(mode="after")
    def _names(self) -> "Recipe":
        seen: set[str] = set()
        for i, s in enumerate(self.sources):
            if s.name is None:
                base = Path(s.path.rstrip("/")).stem
                if not base.strip() or base in (".", ".."):  # (path ".", "..", "a/..": no folder name of its own)
                    base = f"source{i}"
                name, n = base, 1
                while name in seen:
                    n += 1
                    name = f"{base}{n}"
                s.name = name
            if "/" in s.name or s.name in seen:
                raise ValueError(f"source name {s.name!r} must be unique and contain no '/'")
            seen.add(s.name)
        out_names: set[str] = set()
        targets: dict[str, str] = {}  # normalised dir/path -> the output writing there
        keys: dict[str, tuple[str, str]] = {}  # normalised dir/path -> (outputs[i].dir or .path, as written)
        for i, o in enumerate(self.outputs):
            if o.name is None:
                o.name = o.format if o.format not in out_names else f"{o.format}{len(out_names)}"
            if o.name in out_names:
                raise ValueError(f"output name {o.name!r} is used twice; give each output a unique name")
            out_names.add(o.name)
            key = "path" if isinstance(o, (ZipOutput, LatentZipOutput)) else "dir"
            target = getattr(o, key)
            if os.path.isabs(target) or ".." in Path(target).parts:
                raise ValueError(f"output {o.name!r}: {target!r} must be a relative path inside --out")
            norm = _check_target(o.name, target)
            if norm in targets:
                raise ValueError(f"output {o.name!r}: {target!r} is where output {targets[norm]!r} writes too (the "
                                 "same path); give each output its own dir/path")
            _refuse_nested(f"outputs[{i}].{key}", target, norm, o.name, targets, keys)
            targets[norm] = o.name
            keys[norm] = (f"outputs[{i}].{key}", target)
            for sname in o.sources or []:
                if sname not in seen:
                    raise ValueError(f"output {o.name!r} names unknown source {sname!r} (known: {sorted(seen)})")
        audio_only = self.models.vae is None and self.models.audio_vae is not None and all(
            isinstance(o, AUDIO_OUTPUTS) for o in self.outputs if isinstance(o, LATENT_OUTPUTS))
        if any(isinstance(o, LATENT_OUTPUTS) for o in self.outputs) and not audio_only:
            if self.models.vae is None:
                raise ValueError("latent outputs need models.vae, e.g. models: {vae: {family: sd}} (an audio-only "
                                 "dataset needs models.audio_vae instead)")
            if not self.geometry.buckets and any(isinstance(o, BUCKETED_OUTPUTS) for o in self.outputs):
                raise ValueError("latent outputs need geometry.buckets, e.g. geometry: {buckets: [256x256x1]}")
            zips = [o.name for o in self.outputs if isinstance(o, LatentZipOutput)]
            if zips and self.models.vae.store != "mean_std":
                others = [o.name for o in self.outputs if isinstance(o, BUCKETED_OUTPUTS)]
                raise ValueError(
                    f"models.vae.store is {self.models.vae.store!r}, but output {zips[0]!r} (latent_zip) stores the "
                    "posterior mean and std; set models.vae.store: mean_std" + (
                        f" (the encode stage has one VAE setting: output {others[0]!r} would then store mean and std "
                        "too; build it from a recipe of its own to keep store: "
                        f"{self.models.vae.store})" if others else ""))
        if any(isinstance(o, PrecomputedOutput) for o in self.outputs) and self.models.text is None:
            raise ValueError("a precomputed output needs models.text (LTX trainers require conditions/)")
        if self.models.audio_vae is not None and not any(isinstance(o, AUDIO_OUTPUTS) for o in self.outputs):
            raise ValueError("models.audio_vae is set but no output writes audio latents; add a precomputed or "
                             "latent_wds output, or remove models.audio_vae")
        if self.audio.required and self.models.audio_vae is None:
            raise ValueError("audio.required is true but nothing encodes audio; set models.audio_vae (e.g. "
                             "{family: ltx2_audio}) or remove audio.required")
        return self

    @model_validator(mode="after")
    def _mode(self) -> "Recipe":
        """A mode's partner roles must come from a column of every source (a folder gives none), and
        a mode that encodes audio needs an audio encoder (or audio.skip said plainly)."""
        if self.mode is None:
            return self
        for role in MODE_ROLES[self.mode]:
            for s in self.sources:
                if getattr(s.columns, role) is None:
                    raise ValueError(f"mode {self.mode} needs a {role} for every item, and source {s.name!r} names no "
                                     f"{role} column; give it one (sources[*].columns.{role}: <column>, a table "
                                     f"source) or choose another mode")
        if self.mode in AUDIO_MODES and self.models.audio_vae is None:
            raise ValueError(f"mode {self.mode} encodes audio, but models.audio_vae is not set; set it (e.g. "
                             "{family: ltx2_audio}) or choose a mode without audio")
        return self

    @model_validator(mode="after")
    def _distill(self) -> "Recipe":
        """A kd_wds output needs a teacher, a text encoder and ``distill:``; a teacher needs a kd_wds output;
        a kd_wds output is the only output of its recipe (``shardsmith distill`` writes it alone)."""
        kd = [o for o in self.outputs if isinstance(o, KdWdsOutput)]
        if not kd:
            if self.models.teacher is not None or self.distill is not None:
                raise ValueError("models.teacher / distill are set but no output is a kd_wds output; add outputs: "
                                 "[{format: kd_wds}] (and run shardsmith distill) or remove them")
            return self
        if len(self.outputs) > 1:
            others = [o.name for o in self.outputs if not isinstance(o, KdWdsOutput)]
            raise ValueError(f"a kd_wds output is written by a recipe of its own (shardsmith distill); output(s) "
                             f"{', '.join(others or [kd[1].name])} belong in another recipe")
        missing = [k for k, v in (("models.teacher", self.models.teacher), ("distill", self.distill),
                                  ("models.text", self.models.text or (self.distill and self.distill.text == "source")))
                   if not v]
        if missing:
            raise ValueError(f"output {kd[0].name!r} (kd_wds) needs {', '.join(missing)}: e.g. models: {{teacher: "
                             "{family: callable, entry_point: 'shardsmith.distill.gaussian:velocity', "
                             "parameterisation: flow}, text: {family: minilm}} and distill: {shape: [4, 32, 32]} "
                             "(models.text may be left out with distill.text: source: a prompt_wds / latent_wds "
                             "source's txt_emb.pth)")
        if self.models.teacher.parameterisation == "edm" and "t_list" not in self.distill.model_fields_set:
            raise ValueError("distill.t_list: an edm teacher's times are noise levels sigma, and the default "
                             f"{list(FASTGEN_T_LIST)} is FastGen's flow-matching t_list; give sigmas, e.g. "
                             "[14.6, 3.0, 1.0, 0.3, 0.0] (a Stable Diffusion UNet's range) or [80.0, 10.0, 1.0, 0.1, 0.0]")
        t_max = self.distill.t_list[0]
        if self.models.teacher.parameterisation == "flow" and not 0 < t_max <= 1:
            raise ValueError(f"distill.t_list {self.distill.t_list}: a flow teacher's times lie in [0, 1] and "
                             f"t_list[0] = {t_max} is not in (0, 1]; give e.g. {list(FASTGEN_T_LIST)}")
        if not math.isfinite(t_max):
            raise ValueError(f"distill.t_list {self.distill.t_list}: t_list[0] = {t_max} is not finite; give "
                             "e.g. [80.0, 10.0, 1.0, 0.1, 0.0]")
        if self.distill.preview and self.models.vae is None:
            raise ValueError("distill.preview decodes the teacher's samples to pictures and needs models.vae (the "
                             "VAE of the teacher's latent space); set it or leave preview at 0")
        return self

    @model_validator(mode="after")
    def _video_buckets(self) -> "Recipe":
        """A ``video_wds`` output needs clip buckets (F > 1) of even width and height (H.264 yuv420p)."""
        for i, o in enumerate(self.outputs):
            if not isinstance(o, VideoWdsOutput):
                continue
            clips = [b for b in parse_buckets(self.geometry.buckets) if b.frames > 1] if self.geometry.buckets else []
            if not clips:
                raise ValueError(f"outputs[{i}] ({o.name!r}, video_wds) cuts every clip to a bucket of "
                                 "geometry.buckets with more than 1 frame, and there is none; add one, e.g. "
                                 "geometry: {buckets: [832x480x81]}")
            odd = [str(b) for b in clips if b.width % 2 or b.height % 2]
            if odd:
                raise ValueError(f"outputs[{i}] ({o.name!r}, video_wds): bucket(s) {', '.join(odd)} have an odd width "
                                 "or height, which H.264 (yuv420p) cannot encode; use even sizes")
        return self


def _strip(ann: Any) -> Any:
    """``Annotated[X, ...]`` -> X; ``X | None`` -> X (pydantic puts no tag in an error's location
    for either)."""
    while get_origin(ann) is Annotated:
        ann = get_args(ann)[0]
    if get_origin(ann) in (Union, types.UnionType):
        members = [m for m in get_args(ann) if m is not type(None)]
        if len(members) == 1:
            return _strip(members[0])
    return ann


def _is_model(ann: Any) -> bool:
    return isinstance(ann, type) and issubclass(ann, BaseModel)


def _tags(union: Any) -> dict[str, Any]:
    """Discriminator tag -> member model of a union of models: the one-value ``Literal`` field that every
    member has (``format``), not one that only some members fix (``VideoWdsOutput.codec: "h264"``)."""
    models = [m for m in get_args(union) if _is_model(m)]

    def fixed(m) -> dict[str, Any]:
        return {n: get_args(f.annotation)[0] for n, f in m.model_fields.items()
                if get_origin(f.annotation) is Literal and len(get_args(f.annotation)) == 1}

    per = [fixed(m) for m in models]
    common = set.intersection(*(set(p) for p in per)) if per else set()
    return {tags[n]: m for m, tags in zip(models, per) for n in common}


def _walk(loc: tuple[Any, ...]) -> tuple[str, Any, Any]:
    """A pydantic error location as the user's key path, without the union tags pydantic inserts
    (``outputs[0].dir``, not ``outputs[0].wds.dir``); also the model holding the last key and the
    annotation at the end (None where the path leaves the recipe's models)."""
    path, owner, ann = "", None, Recipe
    for part in loc:
        ann = _strip(ann)
        if get_origin(ann) in (Union, types.UnionType) and isinstance(part, str):
            ann = _tags(ann).get(part)  # a union member's tag, not a key
        elif isinstance(part, int):
            path += f"[{part}]"
            ann = get_args(ann)[0] if get_origin(ann) is list else None
        else:
            path += f".{part}" if path else part
            owner = ann if _is_model(ann) else None
            field = owner.model_fields.get(part) if owner is not None else None
            ann = field.annotation if field is not None else None
    return path, owner, _strip(ann)


def _key_pattern(path: str) -> str:
    """``outputs[3].resolution`` -> ``outputs[*].resolution`` (the key, whatever the list index)."""
    return re.sub(r"\[\d+\]", "[*]", path)


def _unknown_key(key: str, owner: Any) -> str:
    """The message of a key the model at that location does not have: the nearest key, or the keys."""
    keys = list(owner.model_fields) if owner is not None else []
    near = difflib.get_close_matches(key, keys, n=1, cutoff=0.6)
    if near:
        return f"unknown key `{key}`; did you mean `{near[0]}`?"
    return f"unknown key `{key}`" + (f" (keys here: {', '.join(keys)})" if keys else "")


def _bad_tag(e: dict[str, Any], union: Any) -> tuple[str, str]:
    """(key, message) of a union member chosen by a key (``format``) that is missing or unknown."""
    key = e.get("ctx", {}).get("discriminator", "format").strip("'\"")
    tags = list(_tags(union))
    if e["type"] == "union_tag_not_found":
        return key, f"missing: say which {key} this is ({', '.join(tags)})"
    tag = str(e["ctx"].get("tag"))
    near = difflib.get_close_matches(tag, tags, n=1, cutoff=0.5)
    return key, f"unknown {key} {tag!r}" + (f"; did you mean `{near[0]}`?" if near else f"; use one of {', '.join(tags)}")


_HINTS = {  # by the key that failed (never an ancestor's): the fix
    "split.holdout": "use a fraction such as 0.05, a percentage such as 5%, or a whole count such as 100 (0: no "
                     "holdout)",
    "outputs[*].resolution": "use one integer such as 64, or [W, H] for center-crop-wide",
    "outputs[*].transform": "one of center-crop, center-crop-wide, center-crop-dhariwal",
    "sources": "list at least one source: sources: [{path: photos/}]",
    "outputs": "list at least one output: outputs: [{format: wds, dir: wds}]",
    "geometry.buckets": "a list of 'WxHxF' strings, e.g. [960x544x49, 512x512x1]",
    "models.device": "auto, cuda, cpu, or cuda:N for visible GPU N (e.g. cuda:1)",
    "images.background": "three integers in 0..255 (red, green, blue), e.g. [255, 255, 255] for white",
    "outputs[*].codec": "video_wds writes H.264 (codec: h264, the default)",
    "models.text.max_length": "give a length the encoder is used with, e.g. 77 (CLIP), 512 (T5), 1024 (Gemma, "
                              "LTX-2), or leave max_length out for the family's own",
}
_NOT_A_MAPPING = ("model_type", "model_attributes_type", "dict_type")
_MAPPING_HINTS = {  # by the key that holds something other than a mapping: an example of one
    "sources[*]": "each source is a mapping such as {path: photos/}",
    "outputs[*]": "each output is a mapping such as {format: wds, dir: wds}",
    "split": "a mapping such as split: {holdout: 0.05, seed: 0}",
    "images": "a mapping such as images: {min_size: 64}",
    "models": "a mapping such as models: {vae: {family: ltx}}",
    "models.vae": "a mapping such as vae: {family: ltx}",
    "models.text": "a mapping such as text: {family: minilm}",
    "geometry": "a mapping such as geometry: {buckets: [512x512x1]}",
}


def _error_line(e: dict[str, Any]) -> tuple[str, str]:
    """(key path, message with the fix for that key) of one pydantic error."""
    path, owner, ann = _walk(e["loc"])
    msg = e["msg"].removeprefix("Value error, ")
    if e["type"] == "extra_forbidden":
        msg = _unknown_key(str(e["loc"][-1]), owner)
    elif e["type"] in ("union_tag_invalid", "union_tag_not_found"):
        key, msg = _bad_tag(e, ann)
        path = f"{path}.{key}"
    elif e["type"] == "bool_number":  # (raised by the model holding the key: _Strict._no_bool_numbers)
        path = f"{path}.{e['ctx']['key']}" if path else e["ctx"]["key"]
    hint = (_MAPPING_HINTS if e["type"] in _NOT_A_MAPPING else _HINTS).get(_key_pattern(path))
    return path or "<root>", msg + (f"  (fix: {hint})" if hint else "")


def _format_errors(err: ValidationError, origin: str) -> str:
    """One line per failing key (the first error where a union tried several types for it)."""
    lines: dict[str, str] = {}
    for e in err.errors():
        path, msg = _error_line(e)
        lines.setdefault(path, f"  - {path}: {msg}")
    return "\n".join([f"recipe {origin} is not valid:", *lines.values()])


def recipe_from_dict(data: Any, *, base_dir: str | os.PathLike = ".", origin: str = "<dict>") -> Recipe:
    """Validate ``data`` and resolve source paths against ``base_dir``."""
    if not isinstance(data, dict):
        raise RecipeError(f"recipe {origin} must be a mapping with sources: and outputs:, got {type(data).__name__}")
    try:
        recipe = Recipe.model_validate(data)
    except ValidationError as err:
        raise RecipeError(_format_errors(err, origin)) from None
    for i, s in enumerate(recipe.sources):
        s.path = str(resolve_user_path(Path(base_dir) / os.path.expanduser(s.path), f"sources[{i}].path"))
    return recipe


def load_recipe(path: str | os.PathLike) -> Recipe:
    check_no_loop(path, "recipe file")
    p = Path(path)
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise RecipeError(f"recipe file {p} does not exist") from None
    except yaml.YAMLError as exc:
        raise RecipeError(f"recipe {p} is not valid YAML: {exc}") from None
    return recipe_from_dict(data, base_dir=p.parent, origin=str(p))


_NOT_FINGERPRINTED = {"workers": True, "distribute": True, "models": {"compile", "device", "offload"}}  # how to run


def canonical(recipe: Recipe) -> dict[str, Any]:
    """The part of the recipe that determines the output (everything but ``workers``,
    ``models.compile`` and ``models.device``)."""
    return recipe.model_dump(mode="json", exclude=_NOT_FINGERPRINTED)


def fingerprint(recipe: Recipe) -> str:
    """sha256 of the non-default settings: adding a new key with a default keeps old fingerprints."""
    data = recipe.model_dump(mode="json", exclude=_NOT_FINGERPRINTED, exclude_defaults=True)
    if data.get("models") == {}:  # only unfingerprinted model keys were set
        del data["models"]
    blob = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()


def diff_recipes(old: dict[str, Any], new: dict[str, Any], prefix: str = "") -> list[str]:
    """Key paths whose values differ between two canonical recipes, with both values."""
    out: list[str] = []
    if isinstance(old, dict) and isinstance(new, dict):
        for k in sorted(set(old) | set(new)):
            out += diff_recipes(old.get(k), new.get(k), f"{prefix}.{k}" if prefix else k)
    elif isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        for i, (a, b) in enumerate(zip(old, new)):
            out += diff_recipes(a, b, f"{prefix}[{i}]")
    elif old != new:
        out.append(f"{prefix}: {json.dumps(old)} -> {json.dumps(new)}")
    return out


def set_key(data: dict[str, Any], dotted: str, value: Any) -> None:
    """Apply ``--set outputs[0].image.quality=90`` style overrides to a raw recipe dict."""
    import re

    parts = re.findall(r"[^.\[\]]+|\[\d+\]", dotted)
    if not parts:
        raise RecipeError(f"--set {dotted!r}: empty key path")
    cur: Any = data
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        nxt = parts[i + 1] if not last else None
        if part.startswith("["):
            idx = int(part[1:-1])
            if not isinstance(cur, list) or idx >= len(cur):
                raise RecipeError(f"--set {dotted!r}: {part} is out of range")
            if last:
                cur[idx] = value
            else:
                cur = cur[idx]
        else:
            if not isinstance(cur, dict):
                raise RecipeError(f"--set {dotted!r}: {part!r} is not inside a mapping")
            if last:
                cur[part] = value
            else:
                cur = cur.setdefault(part, [] if nxt and nxt.startswith("[") else {})
