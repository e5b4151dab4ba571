"""Contact sheets: a few thumbnails per output, split and bucket, read from what the build wrote.

- Raw WebDataset outputs: the image member of the first samples (a video member: its first
  frame), with the sample's caption (``txt``).
- EDM ZIPs: the first images, with their class label.
- Latent outputs (``latent_wds``, ``.precomputed/``): the latents of the first samples of each
  bucket, decoded to a picture by the VAE the manifest records (``verify/decode.py``), first
  latent frame only. When the manifest says the VAE has random weights, every such sheet says
  the previews are meaningless. When the VAE cannot be rebuilt or decode fails, the sheet says so
  instead of failing the report.

Reads are capped (:data:`PER_SHEET` thumbnails, :data:`MAX_READS` samples per output and split,
:data:`PREVIEW_BUDGET_S` seconds of decoding), so the report stays fast on a large build. The
``json`` members of a spread of samples are also read (:data:`JSON_SHARDS` shards x
:data:`JSON_PER_SHARD`) for the frames / fps / bucket histograms.
"""

from __future__ import annotations

import base64
import io
import json
import os
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shardsmith.formats import wds as wds_layout
from shardsmith.formats.tar import tar_members
from shardsmith.formats.wds import group_members
from shardsmith.formats.precomputed import CACHE_EXT, LATENTS
from shardsmith.formats.zip import ARRAY_EXT, IMAGE_EXTS, ZIP_LABELS_FILE

PER_SHEET = 8  # thumbnails per output, split and bucket
PREVIEWS_PER_SHEET = 4  # decoded latent previews per output, split and bucket
MAX_READS = 64  # samples read per output and split for the sheets
THUMB_SIDE = 128  # longest side of a thumbnail, pixels
PREVIEW_BUDGET_S = 30.0  # decoding previews stops after this long (the rest of the sheet says so)
JSON_SHARDS, JSON_PER_SHARD = 16, 32  # the json members read for the histograms, per output and split
_IMAGE_MEMBERS = ("jpg", "jpeg", "png", "webp")
_VIDEO_MEMBERS = ("mp4", "webm", "mkv", "avi", "mov")
LATENT_FORMATS = ("latent_wds", "precomputed", "latent_zip")


@dataclass
class Thumb:
    uri: str  # data:image/...;base64,...
    title: str  # sample id / path (user data: escaped when rendered)
    caption: str = ""


@dataclass
class Sheet:
    output: str
    split: str
    bucket: str | None
    kind: str  # "images" or "previews"
    thumbs: list[Thumb] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    pending: list[tuple[Any, str, str]] = field(default_factory=list)  # latents to decode: (z, title, caption)


@dataclass
class SampleFacts:
    """What the json members of the sampled samples say, for the histograms."""

    frames: list[float] = field(default_factory=list)
    fps: list[float] = field(default_factory=list)
    duration: list[float] = field(default_factory=list)
    buckets: dict[str, int] = field(default_factory=dict)
    read: int = 0


def data_uri(img, fmt: str = "JPEG") -> str:
    """A PIL image as a small ``data:`` URI (thumbnailed to :data:`THUMB_SIDE`)."""
    img = img.convert("RGB") if img.mode not in ("RGB", "L") else img
    img.thumbnail((THUMB_SIDE, THUMB_SIDE))
    buf = io.BytesIO()
    if fmt == "PNG":
        img.save(buf, format="PNG", optimize=True)
    else:
        img.save(buf, format="JPEG", quality=80)
    return f"data:image/{fmt.lower()};base64,{base64.b64encode(buf.getvalue()).decode('ascii')}"


def _image_thumb(data: bytes) -> str:
    from PIL import Image

    with Image.open(io.BytesIO(data)) as im:
        im.draft("RGB", (THUMB_SIDE * 2, THUMB_SIDE * 2))
        im.load()
        return data_uri(im)


def _video_thumb(data: bytes) -> str:
    import av

    with av.open(io.BytesIO(data)) as c:
        for frame in c.decode(video=0):
            return data_uri(frame.to_image())
    raise ValueError("no video frame")


def shard_samples(path: Path, fd: int) -> list[tuple[str, dict[str, tuple[int, int]]]]:
    """The samples of one shard, ``[(key, {suffix: (offset, size)})]``, from its headers only
    (``formats``, not the loaders: no torch import for a report of raw outputs)."""
    return group_members(tar_members(path, fd))


def read_member(fd: int, ref: tuple[int, int]) -> bytes:
    off, size = ref
    data = os.pread(fd, size, off) if size else b""
    if len(data) != size:
        raise OSError("unexpected end of data")
    return data


def _text(data: bytes) -> str:
    return bytes(data).decode("utf-8", errors="replace").strip()


def _wds_groups(files: dict[str, Any]) -> dict[str | None, list[str]]:
    """Shard names of one split by bucket (``64x48x1/00000.tar`` -> bucket ``64x48x1``)."""
    groups: dict[str | None, list[str]] = {}
    for sh in files.get("shards") or []:
        name = sh["name"] if isinstance(sh, dict) else str(sh)
        bucket, _, _ = name.rpartition("/")
        groups.setdefault(bucket or None, []).append(name)
    return groups


def _wds_sheets(root: Path, name: str, split: str, files: dict[str, Any], latent: bool,
                facts: SampleFacts) -> list[Sheet]:
    folder = root / files["dir"]
    sheets = []
    reads = 0
    cap = PREVIEWS_PER_SHEET if latent else PER_SHEET
    for bucket, shards in _wds_groups(files).items():
        sheet = Sheet(name, split, bucket, "previews" if latent else "images")
        sheets.append(sheet)
        for shard in shards:
            if len(sheet.thumbs) + len(sheet.pending) >= cap or reads >= MAX_READS:
                break
            path = folder / shard
            try:
                fd = os.open(path, os.O_RDONLY)
            except OSError as exc:
                sheet.notes.append(f"{shard}: cannot be opened ({exc.strerror})")
                continue
            try:
                for key, refs in shard_samples(path, fd):
                    if len(sheet.thumbs) + len(sheet.pending) >= cap or reads >= MAX_READS:
                        break
                    reads += 1
                    caption = _text(read_member(fd, refs[wds_layout.TXT])) if wds_layout.TXT in refs else ""
                    meta = {}
                    if wds_layout.JSON in refs:
                        try:
                            meta = json.loads(read_member(fd, refs[wds_layout.JSON]))
                        except ValueError:
                            meta = {}
                    title = str(meta.get("id") or key) if isinstance(meta, dict) else key
                    if isinstance(meta, dict) and not caption and isinstance(meta.get("caption"), str):
                        caption = meta["caption"]
                    try:
                        if latent:
                            if wds_layout.LATENT in refs:
                                import torch

                                z = torch.load(io.BytesIO(read_member(fd, refs[wds_layout.LATENT])),
                                               map_location="cpu", weights_only=True)
                                sheet.pending.append((z, title, caption))
                            continue
                        img = next((s for s in _IMAGE_MEMBERS if s in refs), None)
                        vid = next((s for s in _VIDEO_MEMBERS if s in refs), None)
                        if img is not None:
                            sheet.thumbs.append(Thumb(_image_thumb(read_member(fd, refs[img])), title, caption))
                        elif vid is not None:
                            sheet.thumbs.append(Thumb(_video_thumb(read_member(fd, refs[vid])), title, caption))
                    except Exception as exc:  # a sample the sheet cannot show: said, not fatal
                        sheet.notes.append(f"{key}: cannot be shown ({type(exc).__name__}: {exc})"[:300])
            except Exception as exc:
                sheet.notes.append(f"{shard}: cannot be read ({type(exc).__name__}: {exc})"[:300])
            finally:
                os.close(fd)
    _wds_facts(folder, [n for shards in _wds_groups(files).values() for n in shards], facts)
    return sheets


def _wds_facts(folder: Path, shards: list[str], facts: SampleFacts) -> None:
    """The json members of up to :data:`JSON_PER_SHARD` samples of :data:`JSON_SHARDS` shards
    spread over the split, into ``facts``."""
    step = max(1, -(-len(shards) // JSON_SHARDS))
    for shard in shards[::step]:
        path = folder / shard
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue
        try:
            for _key, refs in shard_samples(path, fd)[:JSON_PER_SHARD]:
                if wds_layout.JSON in refs:
                    add_facts(facts, json.loads(read_member(fd, refs[wds_layout.JSON])))
        except Exception:  # a damaged shard: its histogram share is missing, nothing more
            continue
        finally:
            os.close(fd)


def add_facts(facts: SampleFacts, meta: Any) -> None:
    """One sample's json (``bucket``, ``source_frames``, ``source_fps``) into ``facts``."""
    if not isinstance(meta, dict):
        return
    facts.read += 1
    if isinstance(meta.get("bucket"), str):
        facts.buckets[meta["bucket"]] = facts.buckets.get(meta["bucket"], 0) + 1
    frames, fps = meta.get("source_frames"), meta.get("source_fps")
    num = (int, float)
    if isinstance(frames, num) and frames > 1:  # a still image is one frame: no video facts
        facts.frames.append(float(frames))
        if isinstance(fps, num) and fps > 0:
            facts.fps.append(float(fps))
            facts.duration.append(round(frames / fps, 3))


def _zip_sheet(root: Path, name: str, split: str, files: dict[str, Any], latent: bool) -> list[Sheet]:
    sheet = Sheet(name, split, None, "previews" if latent else "images")
    path = root / files["path"]
    try:
        with zipfile.ZipFile(path) as zf:
            labels = {}
            if ZIP_LABELS_FILE in zf.namelist():
                try:
                    doc = json.loads(zf.read(ZIP_LABELS_FILE))
                    labels = {m: lab for m, lab in (doc.get("labels") or [])}
                except (ValueError, TypeError):
                    labels = {}
            exts = (ARRAY_EXT,) if latent else IMAGE_EXTS
            members = [m for m in zf.namelist() if m.lower().endswith(exts)]
            for m in sorted(members)[:PER_SHEET]:
                caption = f"label {labels[m]}" if m in labels else ""
                if latent:
                    sheet.notes.append("previews of latent ZIPs are not drawn yet (mean/std arrays)")
                    break
                try:
                    sheet.thumbs.append(Thumb(_image_thumb(zf.read(m)), m, caption))
                except Exception as exc:
                    sheet.notes.append(f"{m}: cannot be shown ({type(exc).__name__}: {exc})"[:300])
    except (OSError, zipfile.BadZipFile) as exc:
        sheet.notes.append(f"{files['path']}: cannot be read ({exc})")
    return [sheet]


def _precomputed_sheets(root: Path, name: str, split: str, files: dict[str, Any]) -> list[Sheet]:
    """The first latents of each bucket (by latent shape, named by the manifest's buckets)."""
    import torch

    by_shape = {tuple(b["latent_shape"]): bucket for bucket, b in (files.get("buckets") or {}).items()
                if b.get("latent_shape")}
    sheets: dict[str, Sheet] = {}
    base = root / files["dir"] / LATENTS
    reads = 0
    for dirpath, dirnames, filenames in os.walk(base):
        dirnames.sort()
        for fn in sorted(filenames):
            if not fn.endswith(CACHE_EXT) or reads >= MAX_READS:
                continue
            reads += 1
            p = Path(dirpath) / fn
            rel = p.relative_to(base).as_posix()
            try:
                d = torch.load(p, map_location="cpu", weights_only=True)
                z = d["latents"]
            except Exception as exc:
                sheets.setdefault("?", Sheet(name, split, None, "previews")).notes.append(
                    f"{rel}: cannot be read ({type(exc).__name__}: {exc})"[:300])
                continue
            shape = tuple(z.shape)
            bucket = by_shape.get(shape) or by_shape.get(tuple(s for i, s in enumerate(shape) if i != 1 or s != 1)) \
                or "x".join(map(str, shape))
            sheet = sheets.setdefault(bucket, Sheet(name, split, bucket, "previews"))
            if len(sheet.pending) < PREVIEWS_PER_SHEET:
                sheet.pending.append((z, rel, ""))
        if reads >= MAX_READS:
            break
    return [sheets[k] for k in sorted(sheets)]


def collect(root: Path, manifest: dict[str, Any], facts: dict[str, SampleFacts]) -> list[Sheet]:
    """Every output's sheets (split by split, bucket by bucket), latents still to be decoded;
    ``facts[output]`` gets what its samples' json say."""
    sheets: list[Sheet] = []
    for name, out in manifest["outputs"].items():
        fmt = out.get("format")
        latent = fmt in LATENT_FORMATS
        f = facts.setdefault(name, SampleFacts())
        for split, files in (out.get("files") or {}).items():
            if not isinstance(files, dict):
                continue
            try:
                if fmt == "precomputed":
                    sheets += _precomputed_sheets(root, name, split, files)
                elif "path" in files:
                    sheets += _zip_sheet(root, name, split, files, latent)
                elif "dir" in files and "shards" in files:
                    sheets += _wds_sheets(root, name, split, files, latent, f)
            except Exception as exc:  # an output the report cannot read: said on its sheet
                s = Sheet(name, split, None, "images")
                s.notes.append(f"cannot be read: {type(exc).__name__}: {exc}"[:300])
                sheets.append(s)
    return sheets


def vae_status(manifest: dict[str, Any]) -> tuple[bool, bool]:
    """(the build recorded a VAE, its weights are random)."""
    models = manifest.get("models") or {}
    vae = models.get("vae") if isinstance(models, dict) else None
    if not isinstance(vae, dict):
        return False, False
    random = "vae" in (models.get("random_weights") or []) or \
        (vae.get("provenance") or {}).get("weights") == "random-weights"
    return True, random


def first_frame(z, image_vae: bool):
    """The latent of the first frame: ``[C, F', H', W']`` -> ``[C, 1, H', W']`` for a video VAE,
    ``[C, H', W']`` for an image VAE (which a ``.precomputed/`` tree stores with ``F' = 1``)."""
    if z.ndim == 4:
        return z[:, 0] if image_vae else z[:, :1]
    return z


def decode_previews(manifest: dict[str, Any], sheets: list[Sheet], device: str = "auto",
                    budget_s: float = PREVIEW_BUDGET_S) -> str | None:
    """Decode every sheet's pending latents to thumbnails with the recorded VAE (first latent
    frame); a note (why there are none, or that the budget ran out), or None."""
    todo = [s for s in sheets if s.pending]
    if not todo:
        return None
    has_vae, _ = vae_status(manifest)
    if not has_vae:
        for s in todo:
            s.notes.append("no VAE recorded in the manifest: latents cannot be previewed")
            s.pending.clear()
        return "no VAE recorded: no latent previews"
    try:
        import torch

        from shardsmith.precheck import resolve_device
        from shardsmith.recipe import recipe_from_dict
        from shardsmith.verify.decode import _to_uint8, _vae_from_manifest

        recipe = recipe_from_dict(manifest["recipe"], base_dir="/")
        vae, _random = _vae_from_manifest(manifest, recipe, resolve_device(device, "--device"))
    except Exception as exc:
        why = f"the recorded VAE could not be loaded ({type(exc).__name__}: {exc})"[:400]
        for s in todo:
            s.notes.append(f"no previews: {why}")
            s.pending.clear()
        return f"no latent previews: {why}"
    from PIL import Image

    image_vae = ((manifest["models"]["vae"].get("spec") or {}).get("kind")) == "image_vae"
    t0 = time.perf_counter()
    note = None
    for s in todo:
        if time.perf_counter() - t0 > budget_s:
            note = f"latent previews stopped after {budget_s:.0f} s; the rest are not drawn"
            s.notes.append(note)
            s.pending.clear()
            continue
        by_shape: dict[tuple, list[tuple[Any, str, str]]] = {}
        for z, title, caption in s.pending:  # one decode call per latent shape
            first = first_frame(z, image_vae)
            by_shape.setdefault(tuple(first.shape), []).append((first, title, caption))
        for group in by_shape.values():
            try:
                batch = torch.stack([g[0] for g in group])
                with torch.inference_mode():
                    decoded = vae.decode(batch.to(vae.device, vae.torch_dtype))
                for (_, title, caption), x in zip(group, decoded):
                    s.thumbs.append(Thumb(data_uri(Image.fromarray(_to_uint8(x)[0]), "PNG"), title, caption))
            except Exception as exc:
                s.notes.append(f"{', '.join(g[1] for g in group)[:120]}: decode failed "
                               f"({type(exc).__name__}: {exc})"[:300])
        s.pending.clear()
    return note
