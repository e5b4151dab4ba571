"""The partners of a latent sample, cut with its target's one geometry (issue 18).

Runs in worker processes, beside :class:`~shardsmith.transform.latent_pixels.LatentPixelMaker`.

Contract of :class:`PartnerCutter` (``names``: the partners the recipe's ``mode`` asks for):

- ``reference`` (IC-LoRA, ``v2v-ic`` / ``av2av-ic``): the item's ``reference`` clip (or image) through
  the target's resize, crop, frame indices and fps (:func:`~shardsmith.transform.geometry.for_partner`),
  so its pixels have the target's bucket and line up with it: uint8 ``[F, H, W, 3]`` (a still
  reference: one frame); with ``downscale`` k, ``[F, H/k, W/k, 3]`` (the same view, smaller), with
  ``temporal_scale`` k the target's first frame then every k-th (:meth:`PartnerCutter.reference_frames`). A reference of
  another aspect ratio is ``failed:reference_geometry_mismatch``; one with fewer frames than the target
  takes is ``failed:reference_too_short``; one that does not decode ``failed:reference_<reason>``.
- ``source`` (``image-edit``): the item's ``source`` image through the target's resize and crop,
  ``[1, H, W, 3]``; the same refusals with ``source_``.
- ``first_frame`` (``i2v``): the target's first frame after its crop (``pixels[:1]``), never decoded
  again from the file at another geometry; also given as JPEG bytes (``first_frame_jpeg``).
- ``cut(item, geom, pixels)`` returns ``{name: frames}`` for the latent encoder.
- Every partner file is read as the plan hashed it, as its target is (:func:`planned_bytes`): one changed
  since the plan is ``failed:<role>_changed_since_plan``, one gone ``failed:<role>_vanished``.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np

from shardsmith.records import ItemError, PlannedItem
from shardsmith.transform.geometry import Geometry, for_partner

PARTNER_NAMES = ("reference", "source", "first_frame")
#: the partners each mode's latent samples carry
MODE_PARTNERS: dict[str, tuple[str, ...]] = {"v2v-ic": ("reference",), "av2av-ic": ("reference",),
                                             "image-edit": ("source",), "i2v": ("first_frame",)}
FIRST_FRAME_QUALITY = 95


def first_frame_jpeg(pixels: np.ndarray) -> bytes:
    """The first frame of uint8 ``[F, H, W, 3]`` pixels as JPEG bytes (quality 95, 4:4:4; deterministic)."""
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(pixels[0])).save(buf, format="JPEG", quality=FIRST_FRAME_QUALITY,
                                                          subsampling=0)
    return buf.getvalue()


@dataclass(frozen=True)
class PartnerCutter:
    names: tuple[str, ...]
    max_pixels: int = 89_478_485
    downscale: int = 1  # the reference's sides: the target's bucket / downscale (LTX's reference downscale)
    temporal_scale: int = 1  # the reference's frames: the target's first, then every temporal_scale-th

    def reference_frames(self, count: int) -> list[int]:
        """Positions in the target's frames that the reference keeps: ``[0, 1, 1 + k, 1 + 2k, ...]``
        (LTX's temporal subsampling: 49 frames with k = 2 -> 25); all of them for k = 1."""
        k = self.temporal_scale
        return list(range(count)) if k == 1 or count <= 1 else [0, *range(1, count, k)]

    def cut(self, item: PlannedItem, geom: Geometry, pixels: np.ndarray) -> dict[str, np.ndarray]:
        """``{name: uint8 [F, H, W, 3]}`` of the partners (see the module contract)."""
        out: dict[str, np.ndarray] = {}
        for name in self.names:
            if name == "first_frame":
                out[name] = np.ascontiguousarray(pixels[:1])
            else:
                out[name] = self._partner(item, name, geom, pixels.shape)
        return out

    def _partner(self, item: PlannedItem, role: str, geom: Geometry, shape: tuple[int, ...]) -> np.ndarray:
        ref = item.media.get(role)
        if ref is None:
            raise ItemError(f"missing_{role}", f"{item.item_id} has no {role}; give it one (sources[*].columns.{role})")
        name = f"{item.item_id}: its {role} {ref.relpath}"
        if ref.kind not in ("video", "image"):
            raise ItemError(f"{role}_unsupported_kind_{ref.kind}",
                            f"{name} is {ref.kind} media; a {role} is an image or a clip")
        data = planned_bytes(item, role)  # the bytes the plan hashed, or failed:<role>_changed_since_plan ...
        if ref.kind == "video":
            from shardsmith.transform.video import decode_frames, probe_video, resize_crop_frames

            pr = _partner_error(role, lambda: probe_video(ref.path, name))
            pg = for_partner(geom, role, pr.width, pr.height, frames=pr.frames, name=item.item_id)
            indices = list(geom.frame_indices or range(shape[0]))
            if role == "reference":
                indices = [indices[i] for i in self.reference_frames(len(indices))]
            frames = _partner_error(role, lambda: decode_frames(ref.path, indices, name))
            if (frames.shape[2], frames.shape[1]) != pg.source_size:  # the decoder's size wins over the probe's
                pg = for_partner(geom, role, frames.shape[2], frames.shape[1], name=item.item_id)
            out = resize_crop_frames(frames, pg)
        elif ref.kind == "image":
            from shardsmith.transform.image import decode_image
            from shardsmith.transform.video import resize_crop_image

            dec = _partner_error(role, lambda: decode_image(data, name=name, max_pixels=self.max_pixels))
            pg = for_partner(geom, role, *dec.image.size, name=item.item_id)
            out = resize_crop_image(dec.image, pg)[None]  # a still: one frame
        if out.shape[1:] != shape[1:]:
            raise ItemError(f"{role}_geometry_mismatch", f"{name} came out {out.shape[2]}x{out.shape[1]}, its target "
                            f"{shape[2]}x{shape[1]}; give a {role} of the target's shape")
        if role == "reference" and self.downscale > 1:
            out = downscale_frames(out, self.downscale)
        return out


def downscale_frames(frames: np.ndarray, k: int) -> np.ndarray:
    """uint8 ``[F, H, W, 3]`` -> ``[F, H/k, W/k, 3]``: the same field of view at 1/k the size (PIL
    bicubic, antialiased as every other resize here). ``H`` and ``W`` must divide by ``k``."""
    from PIL import Image

    f, h, w, _ = frames.shape
    if h % k or w % k:
        raise ValueError(f"{w}x{h} does not divide by the reference downscale factor {k}")
    return np.stack([np.asarray(Image.fromarray(fr).resize((w // k, h // k), Image.BICUBIC)) for fr in frames])


def planned_bytes(item: PlannedItem, role: str) -> bytes:
    """The bytes of the item's ``role`` file as the plan hashed them, as a target's are read
    (:func:`~shardsmith.transform.samples.read_verified`): a file gone since the plan is ``failed:<role>_vanished``,
    one whose bytes are no longer the planned sha256 ``failed:<role>_changed_since_plan`` (never another file's
    pixels under this item's name), one that cannot be read ``failed:<role>_unreadable`` (or
    ``<role>_not_a_regular_file``, ``<role>_symlink_loop``)."""
    from shardsmith.transform.samples import read_verified  # (samples imports the transform modules)

    ref = item.media[role]
    return read_verified(ref.path, ref.sha256, f"{item.item_id}: its {role} {ref.relpath}", prefix=f"{role}_")


def _partner_error(role: str, fn):
    """``fn()``, its :class:`ItemError` renamed to the partner's role (``reference_truncated`` ...)."""
    try:
        return fn()
    except ItemError as e:
        raise ItemError(f"{role}_{e.reason}", e.detail) from None


#: the arrays each mode's samples carry as they are (no encoder): a mask on the latent grid, camera rows
MODE_CONDITIONS: dict[str, tuple[str, ...]] = {"video-inpaint": ("mask",), "camera-video": ("camera",),
                                               "audio-inpaint": ("audio_mask",)}


@dataclass(frozen=True)
class ConditionCutter:
    """The arrays of a sample made on the CPU from its partners, with its target's geometry:

    - ``mask`` (``video-inpaint``): the item's mask file through the target's exact resize, crop and
      frames (:func:`~shardsmith.transform.masks.target_mask`), pooled onto the VAE's latent grid
      (:func:`~shardsmith.transform.masks.latent_mask`, frame 0 alone then groups of ``temporal``; a
      cell is masked when any of its pixels is): float32 0/1 ``[F', H', W']``, the latent's grid exactly.
    - ``camera`` (``camera-video``): the item's camera track sampled at the target's frame indices,
      intrinsics moved onto the output pixels (:func:`~shardsmith.transform.camera.camera_for`): float32
      ``[F, 20]`` (16 world-to-camera extrinsic values row-major, then fx, fy, cx, cy).
    - ``audio_mask`` (``audio-inpaint``, audio-only samples): :meth:`cut_audio`.
    Each file is read as the plan hashed it (:func:`planned_bytes`: ``failed:<role>_changed_since_plan``,
    ``failed:<role>_vanished``). Problems are the item's ``failed:<role>_<reason>`` /
    ``failed:camera_length_mismatch``."""

    names: tuple[str, ...]
    spatial: int = 8
    temporal: int = 1
    audio: object = None  # the audio encoder's settings (encode.audio_vae.AudioSettings): its latent steps

    def cut_audio(self, item: PlannedItem, info: dict) -> dict[str, np.ndarray]:
        """An audio-only sample's conditions: ``audio_mask`` (``audio-inpaint``), the item's ``mask`` file
        on the audio latent's steps (:func:`~shardsmith.transform.masks.load_audio_mask`; an audio file's
        envelope over the very window the target was cut to, resampled as the target was), float32 0/1
        ``[T]``, T the audio latent's exactly."""
        out: dict[str, np.ndarray] = {}
        if "audio_mask" in self.names:
            from shardsmith.transform.masks import load_audio_mask

            ref = item.media.get("mask")
            if ref is None:
                raise ItemError("missing_mask", f"{item.item_id} has no mask; give it one (sources[*].columns.mask)")
            data = planned_bytes(item, "mask")
            steps = self.audio.latent_steps(int(info["samples"]))
            out["audio_mask"] = load_audio_mask(ref.path, item.item_id, steps, rate=info["rate"], start=info["start"],
                                                duration=info["duration"], data=data)
        return out

    def cut(self, item: PlannedItem, geom: Geometry, source_frames: int) -> dict[str, np.ndarray]:
        out: dict[str, np.ndarray] = {}
        for name in self.names:
            if name == "audio_mask":
                continue  # audio-only samples (cut_audio)
            ref = item.media.get(name)
            if ref is None:
                raise ItemError(f"missing_{name}", f"{item.item_id} has no {name}; give it one "
                                f"(sources[*].columns.{name})")
            data = planned_bytes(item, name)  # the file as planned (a video mask is then decoded from its path)
            if name == "mask":
                from shardsmith.transform.masks import latent_mask, target_mask

                pixel = target_mask(ref.path, geom, item.item_id, data=data)
                out[name] = latent_mask(pixel, self.spatial, self.temporal)
            elif name == "camera":
                from shardsmith.transform.camera import camera_for, load_camera

                out[name] = camera_for(load_camera(ref.path, item.item_id, data=data), geom, source_frames,
                                       item.item_id)
        return out
