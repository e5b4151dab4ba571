"""Turn encoded latents and text embeddings into the members each latent output writes.

``LatentMembers`` renders a finished batch (from :class:`~shardsmith.encode.finisher.LatentFinisher`)
into each sample's members, and says their sizes before encoding.

Members
- ``latent_wds``: ``latent.pth`` (``[C, (F'), H', W']``), ``txt_emb.pth`` (``[L, D]``), with audio
  ``audio_latent.pth`` (``[C, T, F]`` float32), ``json``
  (source, bucket, fps, crop, models) and, with ``include_media``, the source bytes under
  their own extension plus the caption as ``txt`` when the item has one (FastGen's raw-media
  key_maps, e.g. ``{real: mp4, condition: txt}``, need it).
- partners (a ``mode`` with them, issue 18): ``latent_wds`` ``ref_latent.pth`` / ``src_latent.pth`` /
  ``first_frame_latent.pth`` and ``first_frame.jpg``; ``precomputed`` ``reference_latents/<mirrored
  path>.pt`` (the reference's, or an edit's source's, latents; named after the target).
- ``<mirrored path>``: the media path with ``.pt`` for its suffix (prefixed by the source's name when several
  sources feed the output), made unique from the plan (:meth:`LatentMembers.sample_rel`): two items it would
  name alike (``x.jpg`` and ``x.png``, two table rows of one clip) never overwrite each other. A file from
  outside the source's folder (a table with ``allow_outside_paths: true``) stays inside the tree: each ``..``
  is a ``__`` folder, an absolute path's root a ``_`` folder (:func:`~shardsmith.formats.precomputed.tree_path`).
- ``precomputed``: ``latents/<mirrored path>.pt``, ``conditions/<mirrored path>.pt`` (with
  ``audio_prompt_embeds`` when the text encoder makes them: LTX-2) and, with audio,
  ``audio_latents/<mirrored path>.pt`` as reference/ltx-trainer.md §2.5 describes; an audio-only
  item (no pixels) has no ``latents/`` file.
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import os

import numpy as np
import torch

from shardsmith.formats.precomputed import (AUDIO_LATENTS, AUDIO_MASKS, CAMERAS, CONDITIONS, LATENTS,
                                            REFERENCE_AUDIO_LATENTS, REFERENCE_LATENTS, VIDEO_MASKS, cache_member,
                                            sample_rel)
from shardsmith.formats.wds import (AUDIO_LATENT, AUDIO_MASK, CAMERA, JSON, LATENT, MASK, PARTNER_LATENTS,
                                    REF_AUDIO_LATENT, TEXT_EMB, TXT, media_suffix)
from shardsmith.recipe import LatentWdsOutput
from shardsmith.records import PlannedItem, SampleResult, SourceInfo
from shardsmith.atomic import atomic_write_bytes
from shardsmith.sinks.precomputed import condition_record, latent_record, pt_bytes
from shardsmith.sinks.pt_write import pt_bytes_rows

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class LatentMembers:
    """The members of one latent output's samples (a
    :class:`~shardsmith.encode.finisher.MemberRenderer`)."""

    takes_audio = True  # render() takes audio= (the finisher passes audio latents only to renderers that do)

    def __init__(self, output, sources: list[SourceInfo], multi_source: bool):
        self.o, self.sources, self.multi = output, sources, multi_source
        self.models: dict[str, dict] = {}  # each model's family, weights and path, for every json (start())
        self.audio_record = None  # the audio encoder's audio_latents/ record maker (start())

    def start(self, stage) -> None:
        """Take the models' identities from the encode stage, once, before its first batch."""
        self.models = {k: {"family": v["spec"]["family"], "weights": v["provenance"]["weights"],
                           "path_or_repo": v["provenance"].get("path_or_repo")}
                       for k, v in stage.describe().items() if k in ("vae", "text", "audio_vae")}
        audio_vae = getattr(stage, "audio_vae", None)
        self.audio_record = audio_vae.record if audio_vae is not None else None

    def render(self, batch: list[tuple[PlannedItem, SampleResult]], z: torch.Tensor | None, texts,
               audio: list | None = None, partners: dict[str, list] | None = None,
               audio_reference: list | None = None) -> None:
        """Set ``res.members`` (and drop ``res.pixels``) of every item of a finished batch; ``z`` is
        None for a batch without pixels (audio-only items), ``audio`` / ``audio_reference`` one audio
        latent per item (or None: the item's and its reference's), ``partners`` ``{name: latent per item}``
        (a reference, a source, the first frame); ``res.conditions`` (a mask, camera rows) are written as
        they are."""
        latents: list = [None] * len(batch)
        shape: tuple[int, ...] = ()
        if z is not None:
            z = z.to(_DTYPES[self.o.latent_dtype]).contiguous()  # the whole batch at once
            if isinstance(self.o, LatentWdsOutput):
                # each item's latent.pth rendered straight from the batch, no tensor per item
                latents = pt_bytes_rows(z)
                shape = tuple(z.shape[1:])
            else:
                latents = [t.clone() for t in z.unbind(0)]
        for i, (item, res) in enumerate(batch):
            text = texts[i] if texts else None
            a = audio[i] if audio is not None else None
            mine = {n: zs[i] for n, zs in (partners or {}).items() if zs[i] is not None}
            ra = audio_reference[i] if audio_reference is not None else None
            made = res.members or {}  # made by the sample maker (the first frame's JPEG)
            if isinstance(self.o, LatentWdsOutput):
                res.members = self._wds_members(item, res, latents[i], shape, text, a)
                res.members.update(condition_members(res.conditions))
                if ra is not None:
                    res.members[REF_AUDIO_LATENT] = pt_bytes(ra.to(torch.float32).contiguous())
                for n, zp in sorted(mine.items()):
                    res.members[PARTNER_LATENTS[n]] = pt_bytes(zp.to(_DTYPES[self.o.latent_dtype]).contiguous())
                res.members.update(made)
            else:
                res.members = self._precomputed_members(item, res, latents[i], text, a)
                rel = self.sample_rel(item)
                for folder, key, arr in precomputed_conditions(res.conditions):
                    res.members[cache_member(folder, rel)] = pt_bytes({key: torch.from_numpy(arr)})
                if ra is not None:
                    res.members[cache_member(REFERENCE_AUDIO_LATENTS, rel)] = pt_bytes(
                        self.audio_record(ra, recorded_duration(res.info["reference_audio"])))
                if "reference" in mine or "source" in mine:  # IC-LoRA / edit conditions: reference_latents/
                    zp = mine.get("reference", mine.get("source"))
                    res.members[cache_member(REFERENCE_LATENTS, rel)] = pt_bytes(
                        latent_record(zp.to(_DTYPES[self.o.latent_dtype]),
                                      res.info.get("reference_fps", res.info.get("fps", 1.0))))
            res.pixels = None

    def _wds_members(self, item: PlannedItem, res: SampleResult, latent: bytes | None, shape: tuple[int, ...],
                     text, audio: torch.Tensor | None = None) -> dict[str, bytes]:
        """A ``latent_wds`` sample's members: ``latent`` is its ``latent.pth`` bytes already."""
        out = {LATENT: latent} if latent is not None else {}
        if text is not None:
            out[TEXT_EMB] = pt_bytes(text[0].to(_DTYPES[self.o.text_dtype]).contiguous())
        if audio is not None:
            out[AUDIO_LATENT] = pt_bytes(audio.to(torch.float32).contiguous())
        out[JSON] = self._json(item, res, shape)
        if self.o.include_media:
            with open(item.path, "rb") as f:
                out[media_suffix(item.path)] = f.read()
            if item.caption is not None:
                out[TXT] = item.caption.encode("utf-8")
        return out

    def sample_rel(self, item: PlannedItem) -> str:
        """The relative path of ``item``'s files in every folder of a ``.precomputed/`` tree: its media path
        mirrored, made unique from the plan (:func:`~shardsmith.formats.precomputed.sample_rel`; the planner
        prefixes keys with the source's name when the recipe has several sources)."""
        name = self.sources[item.source].name
        return sample_rel(item.relpath, name if self.multi else None, key=item.key, item_id=item.item_id,
                          key_source=name if len(self.sources) > 1 else None)

    def _precomputed_members(self, item: PlannedItem, res: SampleResult, z: torch.Tensor | None, text,
                             audio: torch.Tensor | None = None) -> dict[str, bytes]:
        rel = self.sample_rel(item)
        out = {}
        if z is not None:
            out[cache_member(LATENTS, rel)] = pt_bytes(latent_record(z, res.info["fps"]))
        if text is not None:
            dt = _DTYPES[self.o.text_dtype]
            cond = condition_record(text[0].to(dt), text[1], text[2].to(dt) if len(text) > 2 else None)
            out[cache_member(CONDITIONS, rel)] = pt_bytes(cond)
        if audio is not None:
            out[cache_member(AUDIO_LATENTS, rel)] = pt_bytes(self.audio_record(audio, recorded_duration(res.info["audio"])))
        return out

    def _json(self, item: PlannedItem, res: SampleResult, latent_shape: tuple[int, ...]) -> bytes:
        src = self.sources[item.source]
        meta = {"id": item.item_id, "source": src.name, "path": item.relpath, "sha256": item.sha256,
                "caption": item.caption, "label": item.label, "license": src.license, "origin": src.origin,
                "latent_shape": list(latent_shape), "models": self.models, **res.info}
        return json.dumps(meta, sort_keys=True, ensure_ascii=False).encode("utf-8")

    def sizes(self, item: PlannedItem, res: SampleResult, stage) -> list[tuple[str, int]]:
        """``(suffix, bytes)`` of the members a ``latent_wds`` sample will have, exactly, before it
        is encoded by ``stage`` (a ``.pth`` member's length depends on shape and dtype only): shards bounded
        by bytes close at the same samples on every run."""
        out, shape = [], ()
        if res.pixels is not None:
            frames = res.pixels.shape  # [F, H, W, 3]
            pixel = (3, *frames[1:3]) if stage.vae.spec.kind == "image_vae" else (3, *frames[:3])
            shape = stage.vae.spec.latent_shape(pixel)
            out.append((LATENT, _pth_size(shape, self.o.latent_dtype)))
        if stage.text_encoder is not None:
            ts = stage.text_encoder.spec
            out.append((TEXT_EMB, _pth_size((ts.max_length, ts.dim), self.o.text_dtype)))
        for n, frames in sorted((res.partners or {}).items()):
            pixel = (3, *frames.shape[1:3]) if stage.vae.spec.kind == "image_vae" else (3, *frames.shape[:3])
            out.append((PARTNER_LATENTS[n], _pth_size(stage.vae.spec.latent_shape(pixel), self.o.latent_dtype)))
        out += [(k, len(v)) for k, v in sorted((res.members or {}).items())]  # made by the sample maker
        out += [(k, len(v)) for k, v in sorted(condition_members(res.conditions).items())]
        for member, wave in ((AUDIO_LATENT, res.audio), (REF_AUDIO_LATENT, res.audio_reference)):
            if wave is not None:
                a = stage.audio_vae.spec
                steps = stage.audio_vae.latent_steps(wave.length_at(a.sample_rate))
                out.append((member, _pth_size((a.latent_channels, steps, a.frequency_bins), "float32")))
        out.append((JSON, len(self._json(item, res, shape))))
        if self.o.include_media:
            out.append((media_suffix(item.path), os.path.getsize(item.path)))
            if item.caption is not None:
                out.append((TXT, len(item.caption.encode("utf-8"))))
        return out


def recorded_duration(info: dict) -> float:
    """The ``duration`` an ``audio_latents/`` record holds, from a sample's audio info (``AudioCutter``)."""
    return info["recorded_duration"]


def condition_members(conditions: dict | None) -> dict[str, bytes]:
    """A ``latent_wds`` sample's condition members: ``mask.pth`` (the latent-grid mask, a tensor),
    ``audio_mask.pth`` (``[T]``) and ``camera.npy`` (float32 ``[F, 20]``, no pickle)."""
    out: dict[str, bytes] = {}
    for name, arr in sorted((conditions or {}).items()):
        if name in ("mask", "audio_mask"):
            tensor = torch.from_numpy(np.ascontiguousarray(arr, dtype=np.float32))
            out[MASK if name == "mask" else AUDIO_MASK] = pt_bytes(tensor)
        elif name == "camera":
            buf = io.BytesIO()
            np.save(buf, np.ascontiguousarray(arr, dtype=np.float32), allow_pickle=False)
            out[CAMERA] = buf.getvalue()
    return out


def precomputed_conditions(conditions: dict | None) -> list[tuple[str, str, np.ndarray]]:
    """``(folder, key, array)`` of a ``.precomputed/`` sample's conditions: ``video_masks/`` ``{"mask":
    [F', H', W']}`` and ``audio_masks/`` ``{"mask": [T]}`` as LTX's trainer reads them, ``cameras/``
    ``{"camera": [F, 20]}``."""
    folders = {"mask": (VIDEO_MASKS, "mask"), "camera": (CAMERAS, "camera"), "audio_mask": (AUDIO_MASKS, "mask")}
    return [(*folders[n], np.ascontiguousarray(a, dtype=np.float32)) for n, a in sorted((conditions or {}).items())]


@functools.lru_cache(maxsize=64)
def _pth_size(shape: tuple[int, ...], dtype: str) -> int:
    """Bytes of ``torch.save`` of a contiguous tensor of ``shape`` and ``dtype`` (values do not change it)."""
    return len(pt_bytes(torch.zeros(shape, dtype=_DTYPES[dtype])))


def write_negative_prompt(path, stage, prompt: str) -> str:
    """The constant for FastGen's ``files_map``: float32 ``[L, D]`` ``.npy`` (no pickle), atomically; returns
    the sha256 of its bytes (the manifest records it: ``verify`` compares the file with it)."""
    emb = stage.text([prompt])[0][0]
    buf = io.BytesIO()
    np.save(buf, emb.to(torch.float32).numpy(), allow_pickle=False)
    atomic_write_bytes(path, buf.getvalue())
    return hashlib.sha256(buf.getvalue()).hexdigest()
