"""CPU side of latent outputs: one item -> uint8 frames ``[F, H, W, 3]`` cut to its bucket.

Runs in worker processes, like the image sample makers. Images use buckets with F = 1;
videos take the bucket with the closest aspect ratio, then the most frames the clip has
(at the native or the target fps), then the largest area, among the buckets with F > 1 (all of them
when none has); a clip of one usable frame (a still) takes a 1-frame bucket. Outcomes:
- no bucket has few enough frames -> ``skipped:too_short`` (with the clip's frame count; where 1-frame
  buckets exist, why they do not take a clip of several frames);
- metadata over-stated the frames -> ``skipped:too_short`` at decode, never a crash;
- an image with no ``WxHx1`` bucket -> ``skipped:no_image_bucket``; a source smaller than
  its bucket -> ``skipped:too_small`` unless ``images.upscale``.
Each item's geometry is one :class:`~shardsmith.transform.geometry.Geometry` (bucket, resize,
crop, frame indices, fps) decided from the target's size. The result carries the pixels plus
``info`` (bucket, fps, crop, source frames) for the encoder stage and the manifests.
With ``audio`` (an :class:`~shardsmith.transform.audio_samples.AudioCutter`: an output writes
audio latents) a clip's result also carries its audio cut to the same window (``res.audio``,
``info["audio"]``), and an audio file is an audio-only sample (no pixels).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from PIL import Image

from shardsmith.records import NO_AUDIO, WRITTEN, ItemError, PlannedItem, SampleResult
from shardsmith.recipe import ImageRules
from typing import TYPE_CHECKING

from shardsmith.transform.audio_samples import travels_light
from shardsmith.transform.buckets import Bucket, available_frames, choose_bucket, effective_fps, frame_indices
from shardsmith.transform.geometry import Geometry, decide
from shardsmith.transform.image import decode_image
from shardsmith.transform.jpeg_pass import EncodedImage
from shardsmith.transform.samples import read_checked
from shardsmith.transform.video import VideoProbe, decode_frames, probe_video, resize_crop_frames, resize_crop_image

if TYPE_CHECKING:
    from shardsmith.transform.audio_samples import AudioCutter
    from shardsmith.transform.partners import ConditionCutter, PartnerCutter

DRAFT_GAP = 2  # cpu-draft: the DCT-scaled picture keeps at least this many times the resize's size
IMAGE_FPS = 1.0  # what LTX's trainer stores for images


def no_audio(info: dict) -> str | None:
    """The detail of a sample written without the audio its output writes (audio not required), else None."""
    a = info.get("audio")
    if a is None or a["status"] == WRITTEN:
        return None
    return f"{NO_AUDIO}{a['status']}: {a['detail']}"


@dataclass(frozen=True)
class _JpegHeader:
    geom: Geometry
    size: tuple[int, int]  # (w, h) upright
    orientation: int  # EXIF 1..8
    gpu_ok: bool
    draft: tuple[int, int] | None  # the size to decode at (as stored), or None: in full


class LatentPixelMaker:
    def __init__(self, buckets: list[Bucket], rules: ImageRules, target_fps: float | None = None,
                 audio: AudioCutter | None = None, partners: PartnerCutter | None = None,
                 conditions: ConditionCutter | None = None, decoder: str = "cpu"):
        self.buckets, self.rules, self.target_fps, self.audio = buckets, rules, target_fps, audio
        # images.decoder as the build settled it (encode/decoder_choice.py): gpu passes plain JPEGs on undecoded
        # (transform/jpeg_pass.py) unless the item has partners or conditions, which are cut from the
        # target's pixels here; cpu-draft decodes a JPEG at the DCT scale that still covers its resize
        self.gpu_jpeg = decoder == "gpu" and partners is None and conditions is None
        self.draft = decoder in ("cpu-draft", "gpu")
        self.partners, self.conditions = partners, conditions
        self.image_buckets = [b for b in buckets if b.frames == 1]

    def _fit(self, item: PlannedItem, geom: Geometry) -> None:
        """Refuse (``skipped:too_small``) a target its geometry would enlarge, unless ``images.upscale``."""
        (w, h), bucket = geom.source_size, geom.bucket
        if not self.rules.upscale and (w < bucket.width or h < bucket.height):
            if geom.resize[0] > w or geom.resize[1] > h:
                raise ItemError("too_small", f"{item.item_id} is {w}x{h}, smaller than its bucket {bucket}; "
                                "set images.upscale: true to enlarge it", skip=True)

    def is_heavy(self, item: PlannedItem) -> bool:
        """Whether the worker pool sends ``item`` on its own (see Workers.map): a clip (seconds to decode),
        and an audio file whose waveform would be long or large, or whose duration the plan did not give
        (:func:`~shardsmith.transform.audio_samples.travels_light`). Other audio travels in chunks like
        images: one file decodes in milliseconds, and alone each would pay a task's round trip and leave
        few waveforms decoded ahead of the encoder."""
        if item.kind != "audio":
            return item.kind == "video"
        return not travels_light(item, self.audio)

    def __call__(self, item: PlannedItem) -> SampleResult:
        try:
            if item.kind == "image":
                return self._image(item)
            if item.kind == "video":
                return self._video(item)
            if item.kind == "audio" and self.audio is not None:
                return self._audio(item)
            raise ItemError(f"unsupported_kind_{item.kind}", f"{item.item_id} is {item.kind} media; latent "
                            "outputs take images and videos" + (" (and audio files with models.audio_vae)"
                                                                if item.kind == "audio" else ""), skip=True)
        except ItemError as e:
            return SampleResult(idx=item.idx, status=e.status, detail=e.detail)

    def _image(self, item: PlannedItem) -> SampleResult:
        if not self.image_buckets:
            raise ItemError("no_image_bucket", f"{item.item_id} is an image but no bucket has 1 frame; add one "
                            "such as 512x512x1 to geometry.buckets", skip=True)
        data = read_checked(item)
        head = self.jpeg_header(item, data) if self.draft else None  # (cpu-draft and gpu read the header first)
        if head is not None and self.gpu_jpeg and head.gpu_ok:  # decoded on the device (encode/gpu_decode.py)
            (w, h), geom = head.size, head.geom
            frames = EncodedImage(data, head.orientation, head.size, geom.resize, geom.crop, item.item_id,
                                  self.rules.max_pixels, tuple(self.rules.background))
        elif head is not None and head.draft is not None:
            (w, h), geom = head.size, head.geom
            dec = decode_image(data, name=item.item_id, max_pixels=self.rules.max_pixels,
                               background=self.rules.background, draft=head.draft)
            img = dec.image if dec.image.size == geom.resize else dec.image.resize(geom.resize, Image.BICUBIC)
            frames = np.asarray(img.crop(geom.crop))[None]
        else:
            dec = decode_image(data, name=item.item_id, max_pixels=self.rules.max_pixels,
                               background=self.rules.background)
            w, h = dec.image.size
            geom = self.image_geometry(item, w, h)
            frames = resize_crop_image(dec.image, geom)[None]  # decode_image gives RGB
        info = {"bucket": str(geom.bucket), "fps": IMAGE_FPS, "crop": geom.resize_crop.as_dict(), "source_size": [w, h],
                "source_frames": 1}
        if self.audio is not None:
            info["audio"] = self.audio.for_image(item)[1]
        res = SampleResult(idx=item.idx, status=WRITTEN, pixels=frames, info=info, detail=no_audio(info))
        return self._with_partners(item, geom, res, 1)

    def jpeg_header(self, item: PlannedItem, data: bytes) -> "_JpegHeader | None":
        """A JPEG's header read once (not decoded), with the item's geometry from its upright size; None for
        other formats (decoded in full). ``gpu_ok``: the GPU decoder gives what the CPU path gives
        (:func:`~shardsmith.transform.jpeg_pass.gpu_refusal`); ``draft``: for a JPEG shrunk at least 4x, the
        size (as stored) to decode at, as Pillow's ``thumbnail`` (``reducing_gap`` 2): the DCT scale keeps at
        least twice the resize's size and the bicubic resize does the rest; else None."""
        from shardsmith.transform.image import identify
        from shardsmith.transform.jpeg_pass import exif_orientation, gpu_refusal, upright_size

        img = identify(data, name=item.item_id, max_pixels=self.rules.max_pixels)
        if img.format != "JPEG":
            return None
        o = exif_orientation(img)
        w, h = upright_size(*img.size, o)
        geom = self.image_geometry(item, w, h)
        rw, rh = geom.resize
        shrunk = rw * DRAFT_GAP * 2 <= w and rh * DRAFT_GAP * 2 <= h
        return _JpegHeader(geom, (w, h), o, gpu_refusal(img, data) is None,
                           upright_size(rw * DRAFT_GAP, rh * DRAFT_GAP, o) if shrunk else None)

    def image_geometry(self, item: PlannedItem, w: int, h: int) -> Geometry:
        """An image's one geometry decision from its upright size ``w`` x ``h``: the 1-frame
        bucket of the closest aspect, resize and crop. Raises :class:`ItemError`
        ``skipped:no_image_bucket`` / ``skipped:too_small`` (see the module)."""
        if not self.image_buckets:
            raise ItemError("no_image_bucket", f"{item.item_id} is an image but no bucket has 1 frame; add one "
                            "such as 512x512x1 to geometry.buckets", skip=True)
        geom = decide(w, h, choose_bucket(w, h, 1, self.image_buckets), fps=IMAGE_FPS)
        self._fit(item, geom)
        return geom

    def video_geometry(self, item: PlannedItem, pr: VideoProbe) -> Geometry:
        """The clip's one geometry decision from its probe: the bucket (of those with F > 1, or
        all when none has; a clip of one usable frame, a still, takes a 1-frame bucket as LTX's rule
        gives it), the source frames it takes at the target fps, resize and crop.
        Raises :class:`ItemError` ``skipped:too_short`` / ``skipped:too_small`` (see the module)."""
        n_avail = available_frames(pr.frames, pr.fps, self.target_fps)
        video_buckets = [b for b in self.buckets if b.frames > 1] or self.buckets
        bucket = choose_bucket(pr.width, pr.height, n_avail, video_buckets)
        if bucket is None and n_avail == 1:  # all of it fits a 1-frame bucket: nothing of the clip is dropped
            bucket = choose_bucket(pr.width, pr.height, 1, self.buckets)
        if bucket is None:
            raise ItemError("too_short", self._too_short(item, pr, n_avail, video_buckets), skip=True)
        idx = frame_indices(pr.frames, pr.fps, bucket.frames, self.target_fps)
        fps = effective_fps(pr.fps, self.target_fps)
        geom = decide(pr.width, pr.height, bucket, frame_indices=idx, fps=fps)
        self._fit(item, geom)
        if idx is None:
            raise ItemError("too_short", f"{item.item_id}: {pr.frames} frames cannot fill {bucket}", skip=True)
        return geom

    def _too_short(self, item: PlannedItem, pr: VideoProbe, n_avail: int, video_buckets: list[Bucket]) -> str:
        """Why no bucket takes the clip: fewer usable frames than the shortest clip bucket. Where 1-frame buckets
        exist too, says why they do not take it (a clip of more than one frame would lose all but its first)."""
        shortest = min(b.frames for b in video_buckets)
        has = (f"{pr.frames} frames at {pr.fps:g} fps ({n_avail} usable"
               f"{' at %g fps' % self.target_fps if self.target_fps else ''})")
        stills = [str(b) for b in self.buckets if b.frames == 1]
        if not stills or n_avail < 1:
            return (f"{item.item_id} has {has}, fewer than the smallest bucket's {shortest}; add a shorter bucket to "
                    "keep it")
        return (f"{item.item_id} has {has}, fewer than the {shortest} of the shortest clip bucket; a clip of more "
                f"than one frame takes only buckets of more than 1 frame (the 1-frame "
                f"bucket{'s' if len(stills) > 1 else ''} {', '.join(stills)} would keep 1 of its {n_avail} frames); a bucket of 2 to {n_avail} frames keeps it where the VAE "
                "can represent one (a VAE of 1 + 8k frames, as LTX's, has none under 9)")

    def video_frames(self, item: PlannedItem, geom: Geometry) -> tuple[np.ndarray, Geometry]:
        """The clip's chosen frames cut to its bucket, uint8 ``[F, H, W, 3]``, and the geometry
        applied (re-decided when the decoder's size differs from the probe's: the decoder wins)."""
        frames = decode_frames(item.path, list(geom.frame_indices), item.item_id)
        if (frames.shape[2], frames.shape[1]) != geom.source_size:  # the decoder's size wins over the probe's
            geom = decide(frames.shape[2], frames.shape[1], geom.bucket, frame_indices=geom.frame_indices,
                          fps=geom.fps)
        return resize_crop_frames(frames, geom), geom

    def _video(self, item: PlannedItem) -> SampleResult:
        read_checked(item)  # same bytes as planned (and readable)
        pr = probe_video(item.path, item.item_id)
        geom = self.video_geometry(item, pr)
        bucket, fps = geom.bucket, geom.fps
        out, geom = self.video_frames(item, geom)
        info = {"bucket": str(bucket), "fps": fps, "crop": geom.resize_crop.as_dict(),
                "source_size": [pr.width, pr.height], "source_frames": pr.frames, "source_fps": pr.fps}
        wave = None
        if self.audio is not None:
            wave, info["audio"] = self.audio.for_clip(item, geom, pr.fps)
        res = SampleResult(idx=item.idx, status=WRITTEN, pixels=out, info=info, audio=wave, detail=no_audio(info))
        self._reference_audio(item, res)
        return self._with_partners(item, geom, res, pr.frames)

    def _reference_audio(self, item: PlannedItem, res: SampleResult) -> None:
        """With IC-LoRA audio (``av2av-ic``, ``a2a-ic``): the reference's audio over the target's window
        (``res.audio_reference``, ``info["reference_audio"]``)."""
        if self.audio is None or not self.audio.reference or res.audio is None:
            return
        res.audio_reference, res.info["reference_audio"] = self.audio.for_reference(item, res.info["audio"])

    def _with_partners(self, item: PlannedItem, geom: Geometry, res: SampleResult, source_frames: int) -> SampleResult:
        """``res`` with its partners' pixels (``res.partners``) and, for ``first_frame``, the frame's JPEG
        as a member made here (``first_frame.jpg``; the latent outputs that write it keep it), and the
        arrays its conditions give (``res.conditions``: a latent-grid mask, camera rows)."""
        if self.conditions is not None:
            res.conditions = self.conditions.cut(item, geom, source_frames)
            res.info["conditions"] = sorted(res.conditions)
        if self.partners is None:
            return res
        res.partners = self.partners.cut(item, geom, res.pixels)
        if "reference" in res.partners and self.partners.temporal_scale > 1 and res.pixels.shape[0] > 1:
            res.info["reference_fps"] = res.info["fps"] / self.partners.temporal_scale  # as LTX stores it
        if "first_frame" in res.partners:
            from shardsmith.formats.wds import FIRST_FRAME_JPG
            from shardsmith.transform.partners import first_frame_jpeg

            res.members = {FIRST_FRAME_JPG: first_frame_jpeg(res.partners["first_frame"])}
        res.info["partners"] = sorted(res.partners)
        return res

    def _audio(self, item: PlannedItem) -> SampleResult:
        """An audio file: an audio-only sample (its waveform, no pixels)."""
        read_checked(item)  # same bytes as planned (and readable)
        wave, info = self.audio.for_file(item)
        if wave is None:  # audio not required, but an audio-only item has nothing else to write
            raise ItemError(info["status"].split(":", 1)[1], info["detail"])
        res = SampleResult(idx=item.idx, status=WRITTEN, info={"audio": info}, audio=wave)
        if self.audio.durations:  # its duration's bucket: one latent shape (a multi-bucket output's folder)
            from shardsmith.formats.wds import audio_bucket

            res.info["bucket"] = audio_bucket(info["duration"])
        self._reference_audio(item, res)
        if self.conditions is not None:
            res.conditions = self.conditions.cut_audio(item, info) or None
        return res
